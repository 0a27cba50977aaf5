"""Decode attention compiled on CUDA as the engine's graphs launch it (bf16, Qwen3-0.6B's heads, split-KV with the
fused merge, page-table rows through row slots, programmatic dependent launch) against the float64 oracle, and
bit-identical with and without PDL (a launch option must never change a value). A NaN-poisoned shuffled cache;
rows shorter than one key tile, at tile edges and over many splits. Decode with q/k norm, RoPE and the KV write
folded in (`decode_fused_rope`) bit-identical to the two launches it replaces, eagerly and replayed in a CUDA graph."""

from __future__ import annotations

import pytest
import torch
from attention_cases import bits, fused_rope_vs_unfused, make_case, oracle, rel_err, rope_step
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


# A graph step's requests as (first new position, new tokens): rows of 3 and 8 tokens (virtual rows sharing a row
# slot), one at a 64-key tile edge, long and short contexts, 24 one-token rows; then 3 padding rows.
ROPE_REQUESTS = [(62, 3), (1000, 8), (4000, 1), (127, 2), (5, 1)] + [(p, 1) for p in range(200, 2600, 100)]


@cuda_only()
@pytest.mark.parametrize(
    ("heads", "requests", "num_splits", "qk_norm", "pdl"),
    [
        ((16, 8), "mixed", None, True, True),  # Qwen3-0.6B at the engine's split choice (short splits: 2 warps)
        ((16, 8), "mixed", 2, True, False),  # long splits: 4 warps, pipelined tiles
        ((16, 8), "mixed", 33, False, True),  # no q/k norm (Llama, Qwen2); many splits
        ((16, 8), "one", None, True, True),  # the b=1 decode step
        ((32, 8), "mixed", 9, True, True),  # Qwen3-8B
        ((64, 8), "mixed", 4, True, True),  # Qwen3-32B
    ],
)
def test_decode_fused_rope_on_cuda_is_bit_identical(heads, requests, num_splits, qk_norm, pdl) -> None:
    """`decode_attention_fused_rope_triton` against `qk_norm_rope_store` + `decode_attention_triton` with the fused
    merge: output and both caches bit-identical, counters left at zero, twice (a second launch on the same caches)."""
    from tokenrouter.engine.attention import split_counters

    hq, hkv = heads
    dev = torch.device("cuda")
    reqs = ROPE_REQUESTS if requests == "mixed" else [(3000, 1)]
    step = rope_step(reqs, hq, hkv, 128, 16, dtype=torch.bfloat16, qk_norm=qk_norm, seed=61, padding=3).to(dev)
    counters = split_counters(len(step.seq_lens), hkv, dev)
    for _ in range(2):
        assert fused_rope_vs_unfused(step, max_row_tokens=8, num_splits=num_splits, counters=counters, pdl=pdl) == []
        torch.cuda.synchronize()
        assert counters.eq(0).all()


@cuda_only()
def test_decode_fused_rope_replays_in_a_cuda_graph() -> None:
    """The fused launch captured once (Qwen3-0.6B heads, engine split choice, fused merge, PDL) and replayed on a
    second step's inputs and caches copied into its static tensors: bit-identical to the unfused path run eagerly
    on that step."""
    from tokenrouter.engine import triton_ops
    from tokenrouter.engine.attention import split_counters
    from tokenrouter.engine.attention.triton_common import RopeStore
    from tokenrouter.engine.attention.triton_decode import decode_attention_fused_rope_triton, decode_attention_triton

    dev = torch.device("cuda")
    a, b = (rope_step(ROPE_REQUESTS, 16, 8, 128, 16, dtype=torch.bfloat16, qk_norm=True, seed=s, padding=3).to(dev)
            for s in (62, 63))  # fmt: skip
    kf, vf = a.k_cache.clone(), a.v_cache.clone()
    counters = split_counters(len(a.seq_lens), 8, dev)
    out = torch.empty(len(a.seq_lens), 16, 128, device=dev, dtype=torch.bfloat16)
    rope = RopeStore(a.positions, a.cos_sin, a.norm_weight, 1e-6, a.slot_mapping, 8)

    def launch() -> None:
        decode_attention_fused_rope_triton(a.qkv, rope, kf, vf, a.block_tables, a.seq_lens, 128**-0.5, 16, out=out,
                                           counters=counters, pdl=True, row_slots=a.row_slots)  # fmt: skip

    launch()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for name in ("qkv", "positions", "slot_mapping", "row_slots", "seq_lens", "block_tables", "norm_weight"):
        getattr(a, name).copy_(getattr(b, name))
    kf.copy_(b.k_cache)
    vf.copy_(b.v_cache)
    graph.replay()
    torch.cuda.synchronize()
    kr, vr = b.k_cache.clone(), b.v_cache.clone()
    q = triton_ops.qk_norm_rope_store(b.qkv, b.positions, b.cos_sin, b.norm_weight, 1e-6, kr, vr, b.slot_mapping, 16,
                                      8, 128)  # fmt: skip
    ref = decode_attention_triton(q, kr, vr, b.block_tables, b.seq_lens, 128**-0.5, counters=counters,
                                  row_slots=b.row_slots)  # fmt: skip
    assert torch.equal(bits(out), bits(ref))
    assert torch.equal(bits(kf), bits(kr)) and torch.equal(bits(vf), bits(vr))
    assert counters.eq(0).all()
