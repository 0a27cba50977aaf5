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


@cuda_only()
@pytest.mark.parametrize("num_splits", [1, 3, 9])
def test_extend_attention_on_cuda_merges_short_query_blocks_in_the_kernel(num_splits: int) -> None:
    """The 32B's varlen rows (GQA 8: 8-token query blocks) with the engine's counters: splits merged in the forward
    kernel, against the float64 oracle and within bf16 rounding of the reduce kernel's merge; counters left at 0."""
    from tokenrouter.engine.attention import split_counters
    from tokenrouter.engine.attention.triton_extend import extend_attention_triton

    heads, kv_heads, dim, page = 64, 8, 128, 16
    q_lens, lens = [10, 3, 1, 0, 16], [1034, 67, 65, 5, 130]
    case = make_case(lens, kv_heads, dim, page, seed=5)
    q = torch.randn(sum(q_lens), heads, dim, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    ref = oracle(q, case, q_lens, dim**-0.5)
    dev = torch.device("cuda")
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    k, v = (c.to(dev, torch.bfloat16) for c in (case.k_cache, case.v_cache))
    qb, tables, lens_d = q.to(dev, torch.bfloat16), case.block_tables.to(dev), case.seq_lens.to(dev)
    outs = []
    for counters in (split_counters(len(lens) * 4, kv_heads, dev), None):
        out = torch.full_like(qb, float("nan"))
        extend_attention_triton(qb, k, v, tables, cu, lens_d, dim**-0.5, max_q_len=16, out=out,
                                num_splits=num_splits, counters=counters, pdl=True)  # fmt: skip
        torch.cuda.synchronize()
        assert counters is None or counters.eq(0).all()
        outs.append(out.cpu())
    assert not outs[0].isnan().any()
    assert rel_err(outs[0], ref) < 2e-2 and rel_err(outs[0], outs[1]) < 1e-2


@cuda_only()
@pytest.mark.parametrize(("split_keys", "block_m", "programs"), [(256, 0, 0), (256, 128, 0), (1024, 128, 0),
                                                                  (256, 0, 40), (256, 128, 800)])  # fmt: skip
def test_extend_attention_on_cuda_dynamic_splits(split_keys: int, block_m: int, programs: int) -> None:
    """The varlen graphs' short group with `extend_split_keys` (each query block's split count from its own context,
    merged in the kernel) in the default tiles and in `extend_short_block_m = 128` tiles (a 16-token row in one
    block), with and without a program cap (`extend_split_programs`): against the float64 oracle, counters left at
    0, padding tokens untouched."""
    from tokenrouter.engine.attention import split_counters
    from tokenrouter.engine.attention.triton_common import extend_config
    from tokenrouter.engine.attention.triton_extend import extend_attention_triton

    heads, kv_heads, dim, page = 64, 8, 128, 16
    q_lens, lens = [10, 16, 1, 0, 9], [3001, 130, 65, 5, 1034]
    case = make_case(lens, kv_heads, dim, page, seed=7, extra_cols=300)  # a wide table: the grid's 8 splits
    q = torch.randn(sum(q_lens) + 4, heads, dim, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    real = sum(q_lens)
    ref = oracle(q[:real], case, q_lens, dim**-0.5)
    dev = torch.device("cuda")
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    k, v = (c.to(dev, torch.bfloat16) for c in (case.k_cache, case.v_cache))
    qb, tables, lens_d = q.to(dev, torch.bfloat16), case.block_tables.to(dev), case.seq_lens.to(dev)
    counters = split_counters(len(lens) * 2, kv_heads, dev)
    for _ in range(2):  # the second launch finds the counters at zero again
        out = torch.full_like(qb, 7.0)
        extend_attention_triton(qb, k, v, tables, cu, lens_d, dim**-0.5, max_q_len=16, out=out, counters=counters,
                                split_keys=split_keys, split_programs=programs, config=extend_config(block_m),
                                pdl=True)  # fmt: skip
        torch.cuda.synchronize()
        assert counters.eq(0).all()
        got = out.cpu()
        assert got[real:].eq(7.0).all()
        assert rel_err(got[:real], ref) < 2e-2
