"""Decode attention compiled on CUDA as the engine's graphs launch it (bf16, Qwen3-0.6B's heads, split-KV with the
fused merge, page-table rows through row slots, programmatic dependent launch) against the float64 oracle, and
bit-identical with and without PDL (a launch option must never change a value). A NaN-poisoned shuffled cache;
rows shorter than one key tile, at tile edges and over many splits."""

from __future__ import annotations

import pytest
import torch
from attention_cases import make_case, oracle, rel_err
from cuda_marks import cuda_only

SEQ_LENS = [1, 63, 64, 65, 130, 1024, 3001]


@cuda_only()
@pytest.mark.parametrize("num_splits", [1, 4, 33])
def test_decode_attention_on_cuda_matches_oracle_with_and_without_pdl(num_splits: int) -> None:
    from tokenrouter.engine.attention import split_counters
    from tokenrouter.engine.attention.triton_decode import decode_attention_triton

    heads, kv_heads, dim, page = 16, 8, 128, 16
    case = make_case(SEQ_LENS, kv_heads, dim, page, seed=3)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(len(SEQ_LENS), heads, dim, generator=gen, dtype=torch.float64)
    ref = oracle(q, case, [1] * len(SEQ_LENS), dim**-0.5)
    dev = torch.device("cuda")
    # Rows read their page-table row through slots, as the engine's graphs do: table rows in reverse order.
    slots = torch.arange(len(SEQ_LENS) - 1, -1, -1, dtype=torch.int32, device=dev)
    tables = case.block_tables.flip(0).contiguous().to(dev)
    k, v = (c.to(dev, torch.bfloat16) for c in (case.k_cache, case.v_cache))
    qb = q.to(dev, torch.bfloat16)
    outs = {}
    for pdl in (True, False):
        counters = split_counters(len(SEQ_LENS), kv_heads, dev)
        out = torch.full_like(qb, float("nan"))
        decode_attention_triton(qb, k, v, tables, case.seq_lens.to(dev), dim**-0.5, out=out, num_splits=num_splits,
                                counters=counters, pdl=pdl, row_slots=slots)  # fmt: skip
        torch.cuda.synchronize()
        assert counters.eq(0).all(), "the fused merge leaves its arrival counters at zero"
        outs[pdl] = out.cpu()
    assert not outs[True].isnan().any()
    assert rel_err(outs[True], ref) < 2e-2
    assert torch.equal(outs[True], outs[False])
