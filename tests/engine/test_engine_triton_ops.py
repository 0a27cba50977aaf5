"""The engine's Triton elementwise kernels (RMSNorm with residual/gather, q/k-norm + RoPE + KV store, SwiGLU)
against the torch paths in Triton's CPU interpreter, the whole model on the Triton path (elementwise ops and
attention) against HF under every launch-overhead switch, kernel launches per layer, and an ahead-of-time
sm_90 compile of the kernels (catches GPU-only compile errors). Both run this file as a script in a fresh
process (see `_run_self`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _run_self(flag: str, interpret: bool) -> None:
    from engine_testlib import run_self  # lazily: importing the engine early would fix Triton's mode here

    run_self(__file__, flag, interpret)


def test_triton_ops_match_torch_in_interpreter():
    """RMSNorm (+residual, +row gather), q/k-norm + RoPE + KV store, SwiGLU vs the torch paths; then the whole
    model on the Triton path (the CUDA code path) against HF, with the padded graph path, on CPU, for the
    baseline and the default launch-overhead switches, and the kernels each launches per layer; a varlen graph
    step of decode rows beside a sampled prefill against the torch path."""
    _run_self("--interpret", interpret=True)


def test_kernels_compile_for_sm90():
    _run_self("--aot", interpret=False)


def _close(a, b, tol):
    a, b = a.float(), b.float()
    err = float((a - b).abs().max())
    assert err <= tol * float(b.abs().max().clamp_min(1e-6)), err


def _check_rms_norm(tops, dtype, n):
    from tokenrouter.engine.layers import rms_norm_ref

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, n, generator=g).to(dtype)
    r = torch.randn(5, n, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    y, none = tops.rms_norm(x, w, 1e-6)
    assert none is None
    _close(y, rms_norm_ref(x, w, 1e-6), tol)
    y, res = tops.rms_norm(x, w, 1e-6, r)
    # The interpreter rounds fp32 -> bf16 toward zero (GPUs round to nearest): allow one bf16 ulp.
    _close(res, x + r, 0 if dtype == torch.float32 else 1e-2)
    _close(y, rms_norm_ref(x + r, w, 1e-6), tol)


def _check_rms_norm_gather(tops, dtype):
    """Row gather (embedding lookup into the first norm; final add + logit-row gather + norm into a buffer)."""
    from tokenrouter.engine.layers import rms_norm_ref

    g = torch.Generator().manual_seed(3)
    n = 48
    table = torch.randn(10, n, generator=g).to(dtype)
    r = torch.randn(10, n, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    idx = torch.tensor([7, 0, 7, 3], dtype=torch.int32)
    # bf16: the interpreter truncates the rounded residual sum where torch rounds to nearest (one ulp).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    y, s = tops.rms_norm(table, w, 1e-6, index=idx, store_sum=True)
    assert torch.equal(s, table[idx.long()])
    _close(y, rms_norm_ref(table[idx.long()], w, 1e-6), tol)
    out = torch.full((4, n), float("nan"), dtype=dtype)
    y, none = tops.rms_norm(table, w, 1e-6, r, index=idx.long(), store_sum=False, out=out)
    assert none is None and y is out
    _close(out, rms_norm_ref((table + r)[idx.long()], w, 1e-6), tol)


def _check_qk_norm_rope_store(tops, dtype, head_dim, qk_norm, heads_per_program=None):
    from tokenrouter.engine.attention import store_kv
    from tokenrouter.engine.layers import RotaryEmbedding, rms_norm_ref

    hq, hkv, t, page = 4, 2, 6, 4
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, (hq + 2 * hkv) * head_dim, generator=g).to(dtype)
    pos = torch.tensor([0, 5, 6, 7, 30, 2], dtype=torch.int32)
    slots = torch.tensor([4, 9, 10, 11, 13, 0], dtype=torch.int64)
    rope = RotaryEmbedding(head_dim, 1e6, 64, device=torch.device("cpu"))
    nw = (1 + 0.1 * torch.randn(2, head_dim, generator=g)).to(dtype) if qk_norm else None
    kc, vc = torch.zeros(2, 5, page, hkv, head_dim, dtype=dtype)
    q = tops.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc, vc, slots, hq, hkv, head_dim,
                                heads_per_program=heads_per_program)  # fmt: skip

    rq = qkv[:, : hq * head_dim].view(t, hq, head_dim)
    rk = qkv[:, hq * head_dim : (hq + hkv) * head_dim].view(t, hkv, head_dim)
    rv = qkv[:, (hq + hkv) * head_dim :].reshape(t, hkv, head_dim)
    if qk_norm:
        rq, rk = rms_norm_ref(rq, nw[0], 1e-6), rms_norm_ref(rk, nw[1], 1e-6)
    rq, rk = rope(pos, rq, rk)
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kv(rk, rv, kr, vr, slots)
    # fp32 checks the math tightly; bf16 only the dtype plumbing, since the interpreter truncates at each of
    # the kernel's bf16 rounding points where a GPU rounds to nearest.
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    _close(q, rq, tol)
    _close(kc, kr, tol)
    assert torch.equal(vc, vr)  # a plain copy


def _check_rope_heads_rule(tops):
    """Heads share a program only past ROPE_MAX_PROGRAMS programs: against a brute-force search of the rule."""
    for heads in (24, 40, 72):  # Qwen3-0.6B, -8B, -32B: q + kv heads
        for t in (1, 8, 16, 42, 43, 96, 512, 8192):
            cap = tops.ROPE_MAX_HEADS
            want = next((p for p in (1, 2, 4, 8, 16) if p == cap or t * -(-heads // p) <= tops.ROPE_MAX_PROGRAMS), cap)
            assert tops.rope_heads_per_program(t, heads) == want, (t, heads)
    assert tops.rope_heads_per_program(8, 24) == 1  # decode steps keep one head a program
    with pytest.raises(ValueError, match="power of two"):
        kc = torch.zeros(2, 4, 2, 16)
        tops.qk_norm_rope_store(torch.zeros(1, 64), torch.zeros(1, dtype=torch.int32), torch.zeros(4, 16), None,
                                1e-6, kc, kc.clone(), torch.zeros(1, dtype=torch.int64), 2, 1, 16,
                                heads_per_program=3)  # fmt: skip


def _check_silu_and_mul(tops, dtype):
    x = torch.randn(3, 2 * 1100, generator=torch.Generator().manual_seed(2)).to(dtype)
    ref = torch.nn.functional.silu(x[:, :1100]) * x[:, 1100:]
    _close(tops.silu_and_mul(x), ref, 1e-5 if dtype == torch.float32 else 1e-2)


def _check_model_matches_hf(tops):
    import tempfile
    from pathlib import Path

    from engine_testlib import Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=12)
        eng = tiny_engine(tmp, ops_backend="triton", graph_emulation=True)
        assert eng.model.layers[0].self_attn._ops is tops
        scn = Scenario(eng, seed=12)
        scn.finish()
        check_against_hf(scn, hf, tol=1e-4)


def _check_warm_rope_heads(tops):
    """The warmup launches the rope kernel once at every heads-a-program choice, on the null slot only."""
    import tempfile
    from pathlib import Path

    from engine_testlib import make_hf_checkpoint, tiny_engine

    from tokenrouter.engine import warmup

    with tempfile.TemporaryDirectory() as tmp:
        make_hf_checkpoint(Path(tmp), seed=3)
        eng = tiny_engine(tmp, ops_backend="triton", graph_emulation=True)
        seen, real = [], tops.qk_norm_rope_store

        def spy(*a, **kw):
            seen.append(kw["heads_per_program"])
            assert int(a[7].max()) == 0  # slot_mapping: the null slot
            return real(*a, **kw)

        tops.qk_norm_rope_store = spy
        try:
            warmup.warm_rope_heads(eng)
        finally:
            tops.qk_norm_rope_store = real
        assert seen == [1 << i for i in range(tops.ROPE_MAX_HEADS.bit_length())], seen


def _decode_step_launches(eng):
    """The graph body launches of a one-row decode step after a fresh 20-token prefill (`count_graph_body_launches`)."""
    from tokenrouter.core.batch import Batch, BatchRow
    from tokenrouter.core.request import Request
    from tokenrouter.engine.launch_count import count_graph_body_launches

    req = Request("x", list(range(1, 21)), 20)
    assert eng.kv_pool.grow(req.pages, 21)
    eng.step(Batch(0, 0, [BatchRow(req, 0, 20)]))
    req.num_computed = 20
    req.token_ids.append(5)
    return count_graph_body_launches(eng, Batch(0, 1, [BatchRow(req, 20, 1)]))


def _check_switches_match_hf_and_count_kernels(tops):
    """Triton elementwise ops + Triton attention (forced 3-way KV split) on the padded graph path: baseline
    and default switches match HF over the whole scenario (each switch alone is a subset of the default), and
    a decode step's graph body launches 10 kernels per layer in the baseline, 9 with the fused split merge,
    with 11 (baseline) or 5 (step fusion) launches outside the layers."""
    import tempfile
    from pathlib import Path

    from engine_testlib import Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

    from tokenrouter.engine.config import BASELINE_SWITCHES

    variants = {
        "baseline": (BASELINE_SWITCHES, 10, 11),
        "fused_reduce": ({**BASELINE_SWITCHES, "decode_fused_reduce": True}, 9, 11),
        # outside the layers: the step prologue, the greedy argmax and the in-graph sampler, around norm + LM head
        # (fused) or the baseline's embedding, add, gather, norm, LM head, two output copies and the slot cast
        "step_fusion": ({**BASELINE_SWITCHES, "fuse_step_ops": True}, 10, 5),
        "pdl": ({**BASELINE_SWITCHES, "triton_pdl": True}, 10, 11),  # PDL is CUDA-only: a no-op here
        # 8 per layer once the Triton skinny GEMM (SwiGLU folded into the down projection) is on by default; 6
        # with both norms folded into the projections after them (7 in layer 0: its norm gathers the embedding)
        "default": ({}, ([7, 6] if _default("gemv_fold_norm") else 8) if _default("triton_gemv") else 9, 5),
    }
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=13)
        for name, (switches, per_layer, step) in variants.items():
            eng = tiny_engine(
                tmp, ops_backend="triton", attention_backend="triton", graph_emulation=True, decode_num_splits=3,
                **switches,
            )  # fmt: skip
            assert eng.pdl is False
            assert (eng.split_counters is not None) == eng.config.decode_fused_reduce, name
            if name in ("baseline", "default"):
                scn = Scenario(eng, seed=13)
                scn.finish()
                check_against_hf(scn, hf, tol=1e-4)
            lc = _decode_step_launches(eng)
            got = (lc.per_layer(), len(lc.sections["step"]))
            want = per_layer if isinstance(per_layer, list) else [per_layer] * 2
            assert got == (want, step), f"{name}: {got} {lc.sections}"
            if eng.split_counters is not None:
                assert eng.split_counters.eq(0).all()


def _check_varlen_graph_prefill_beside_decode_rows(tops):
    """The step that sampled all-NaN logits live: 3 decode rows and a sampled 38-token prefill in the 48-token varlen
    graph, Triton attention and ops, a block table wide enough (1024-token context, 63 pages) that both row groups split
    the KV. The short group's split reduce once overwrote the prefill's attention output with its unwritten
    partials; the logits must match the torch path's plain eager pass."""
    import tempfile
    from pathlib import Path

    from engine_testlib import decode_rows_beside_prefill, make_hf_checkpoint, tiny_engine

    kw = {"page_size": 16, "num_pages": 64, "max_batch_size": 8, "max_num_batched_tokens": 64}
    with tempfile.TemporaryDirectory() as tmp:
        make_hf_checkpoint(Path(tmp), seed=31, max_position_embeddings=1024)
        eng = tiny_engine(tmp, attention_backend="triton", ops_backend="triton", graph_emulation=True, **kw)
        h, res = decode_rows_beside_prefill(eng, [3, 5, 2], 38)
        _, ref = decode_rows_beside_prefill(tiny_engine(tmp, **kw), [3, 5, 2], 38)
    # ~1k tokens of block-table width (63 pages): both row groups split the KV (`choose_num_splits`, >= 256 a split)
    assert h.varlen_bucket == 48 and eng.table.table.shape[1] * 16 > 3 * 256
    assert torch.isfinite(res.logits).all()
    assert res.next_token_ids.tolist() == ref.next_token_ids.tolist()
    _close(res.logits, ref.logits, 1e-4)


def _check_varlen_extend_fused_merge(tops):
    """`extend_fused_reduce` on a GQA-8 model (8-token query blocks, as the 32B's): the same varlen step as above
    merges every split in the attention kernels (no reduce launch at all) and matches the torch path's eager pass;
    `extend_split_keys` likewise for the short-row group, whose splits then follow each row's context."""
    import tempfile
    from pathlib import Path

    from engine_testlib import decode_rows_beside_prefill, make_hf_checkpoint, tiny_engine

    from tokenrouter.engine.attention import triton_common

    kw = {"page_size": 16, "num_pages": 64, "max_batch_size": 8, "max_num_batched_tokens": 64}
    launches = []
    real = triton_common.split_reduce_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    fwd_kwargs: list[dict] = []
    real_fwd = triton_common.paged_attention_fwd_kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                fwd_kwargs.append(kw)
                return real_fwd[grid](*args, **kw)

            return launch

    with tempfile.TemporaryDirectory() as tmp:
        make_hf_checkpoint(Path(tmp), seed=32, max_position_embeddings=1024, num_attention_heads=8,
                           num_key_value_heads=1)  # fmt: skip
        _, ref = decode_rows_beside_prefill(tiny_engine(tmp, **kw), [3, 5, 2], 38)
        # (fused merge, dynamic split keys, short tile rows, program cap): keys 16 splits the short rows' ~40-token
        # contexts on the device; 128-row short tiles hold a whole row (up to 16 tokens at GQA 8) in one query block;
        # a program cap (counted on the device from the busy rows) may lower the split count, never the result
        for fused, keys, bm, progs in ((False, 0, 0, 0), (True, 0, 0, 0), (False, 16, 0, 0), (False, 16, 128, 0),
                                       (False, 16, 0, 24)):  # fmt: skip
            eng = tiny_engine(tmp, attention_backend="triton", ops_backend="triton", graph_emulation=True,
                              extend_fused_reduce=fused, extend_split_keys=keys, extend_short_block_m=bm,
                              extend_split_programs=progs, **kw)  # fmt: skip
            launches.clear()
            fwd_kwargs.clear()
            triton_common.split_reduce_kernel = Counting()
            triton_common.paged_attention_fwd_kernel = Recording()
            try:
                h, res = decode_rows_beside_prefill(eng, [3, 5, 2], 38)
            finally:
                triton_common.split_reduce_kernel = real
                triton_common.paged_attention_fwd_kernel = real_fwd
            assert h.varlen_bucket == 48
            # without: both row groups' reduces; dynamic short-group splits: only the long group's
            # without either: both row groups' reduces; with keys the counters make every split merge in-kernel
            assert (len(launches) == 0) == (fused or keys > 0), (fused, keys, len(launches))
            assert any(kw["DYN_SPLITS"] for kw in fwd_kwargs) == (keys > 0)
            assert any(kw["BLOCK_Q"] == 16 and kw["DYN_SPLITS"] for kw in fwd_kwargs) == (bm == 128)
            assert any(kw["ROWS_P2"] > 1 for kw in fwd_kwargs) == (progs > 0)
            assert res.next_token_ids.tolist() == ref.next_token_ids.tolist()
            _close(res.logits, ref.logits, 1e-4)
            assert eng.split_counters.eq(0).all()


def _check_decode_fused_rope(tops, arch):
    """`decode_fused_rope` (q/k norm + RoPE + KV write inside decode attention) on the padded graph path: the whole
    scenario (decode rows, returns of 2-8 tokens as virtual rows sharing a row slot, forced 3-way KV splits) gives
    bit-identical logits, hidden states, tokens and KV caches to the unfused path, with one kernel a layer fewer."""
    import tempfile
    from pathlib import Path

    from engine_testlib import Scenario, make_hf_checkpoint, tiny_engine

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        make_hf_checkpoint(Path(tmp), arch, seed=14)
        for fused in (False, True):
            eng = tiny_engine(tmp, ops_backend="triton", attention_backend="triton", graph_emulation=True,
                              decode_num_splits=3, decode_fused_rope=fused)  # fmt: skip
            scn = Scenario(eng, seed=14)
            scn.finish()
            caches = [c.clone() for layer in eng.kv_cache.layers for c in layer]
            lc = _decode_step_launches(eng)
            names = {n for s, ns in lc.sections.items() if s != "step" for n in ns}
            assert ("triton._qk_norm_rope_store_kernel" in names) != fused, names
            runs[fused] = (scn.records, caches, lc.per_layer())
    (recs, caches, per_layer), (recs_f, caches_f, per_layer_f) = runs[False], runs[True]
    assert [p - 1 for p in per_layer] == per_layer_f, (per_layer, per_layer_f)
    assert len(recs) == len(recs_f) > 0
    for a, b in zip(recs, recs_f, strict=True):
        assert (a.rid, a.pos, a.token) == (b.rid, b.pos, b.token)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden), (a.rid, a.pos)
    for a, b in zip(caches, caches_f, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _check_step_kernels(tops):
    """In-graph sampling (greedy, temperature, top-k, top-p, both; log-probabilities of the rows that ask) and the
    step prologue (page-table writes, from_prev tokens) against their torch definitions; vocab not a multiple of
    the block, ties included."""
    from tokenrouter.engine import triton_step
    from tokenrouter.engine.sampler import LOGPROB_WORDS, MAX_LOGPROBS, sample_rows, token_logprobs

    g = torch.Generator().manual_seed(3)
    rows, vocab = 24, 3000
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16)  # bf16: many exact ties
    logits[5, :] = 1.0  # a row of one value: every filter keeps everything
    temp = torch.tensor([0.0, 0.7, 1.0, 1.5] * 6)
    inv = torch.where(temp > 0, 1.0 / torch.where(temp > 0, temp, 1.0), 0.0).float()
    top_k = torch.tensor([0, 0, 5, 50, 0, 1] * 4, dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.3, 1.0, 0.99, 0.8] * 3)
    seed = torch.randint(-(2**31), 2**31 - 1, (rows,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, 4000, (rows,), generator=g, dtype=torch.int32)
    out_slot = torch.arange(rows, dtype=torch.int32) + 1
    out = torch.full((rows,), -1, dtype=torch.int32)
    slot_tok = torch.zeros(rows + 1, dtype=torch.int32)
    # log-probabilities for the rows that ask (k = 0, 1, 5, 20) beside rows that do not (their words untouched)
    k1 = torch.tensor([1, 0, 2, 6, 21, 0] * 4, dtype=torch.int32)
    lp_out = torch.full((rows * LOGPROB_WORDS,), -7, dtype=torch.int32)
    logits[7, [100, 2900]] = 99.0  # the maximum twice, in two argmax chunks: the first index wins
    logits[8, [300, 301]] = 99.0  # twice in one chunk
    ref = sample_rows(logits, inv, top_p, top_k, seed, pos)
    assert int(ref[8 - 8]) >= 0 and int(logits[7].float().argmax()) == 100
    for chunk in (256, 0):  # the chunked argmax kernel (merged in the sampler), then torch's argmax
        out.fill_(-1)
        slot_tok.zero_()
        lp_out.fill_(-7)
        triton_step.sample(logits, inv, top_p, top_k, seed, pos, out_slot, out, slot_tok, k1, lp_out,
                           argmax_chunk=chunk)  # fmt: skip
        assert out.tolist() == ref.tolist(), (chunk, out.tolist(), ref.tolist())
        assert slot_tok[1:].tolist() == ref.tolist()
    region = lp_out.view(rows, LOGPROB_WORDS)
    vals = region.view(torch.float32)
    for r in range(rows):
        k = int(k1[r]) - 1
        if k < 0:
            assert region[r].eq(-7).all(), r
            continue
        tok_lp, ids, top = token_logprobs(logits[r : r + 1], out[r : r + 1], k)
        _close(vals[r, :1], tok_lp, 1e-5)
        assert region[r, 1 : 1 + k].tolist() == ids[0].tolist(), r  # bf16 ties: ordered by id, as the reference
        if k:
            _close(vals[r, 1 + MAX_LOGPROBS : 1 + MAX_LOGPROBS + k], top[0], 1e-5)
    table = torch.zeros(4, 8, dtype=torch.int32)
    ids = torch.tensor([7, 0, 9, 0], dtype=torch.int32)
    prev = torch.tensor([-1, 3, -1, 1], dtype=torch.int32)
    toks = torch.tensor([0, 11, 0, 33], dtype=torch.int32)
    triton_step.step_prologue(table, torch.tensor([9, 30], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32),
                              ids, prev, toks)  # fmt: skip
    assert ids.tolist() == [7, 33, 9, 11] and table.view(-1)[[9, 30]].tolist() == [5, 6]
    assert int(table.sum()) == 11


def _check_attention_row_slots(tops):
    """Attention rows read their page tables through row slots: same result as gathering the rows first."""
    from tokenrouter.engine.attention import decode_attention, extend_attention

    g = torch.Generator().manual_seed(4)
    k_cache = torch.randn(20, 4, 2, 16, generator=g)
    v_cache = torch.randn(20, 4, 2, 16, generator=g)
    table = torch.randint(1, 20, (6, 5), generator=g, dtype=torch.int32)
    slots = torch.tensor([4, 1, 4], dtype=torch.int32)
    seq = torch.tensor([17, 9, 3], dtype=torch.int32)
    q = torch.randn(3, 4, 16, generator=g)
    dense = table[slots.long()]
    for backend in ("triton", "torch"):
        a = decode_attention(q, k_cache, v_cache, table, seq, 0.25, backend=backend, row_slots=slots, num_splits=2)
        b = decode_attention(q, k_cache, v_cache, dense, seq, 0.25, backend="torch")
        _close(a, b, 1e-5)
        qe = torch.randn(6, 4, 16, generator=g)
        cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
        a = extend_attention(qe, k_cache, v_cache, table, cu, seq, 0.25, backend=backend, row_slots=slots, max_q_len=3)
        b = extend_attention(qe, k_cache, v_cache, dense, cu, seq, 0.25, backend="torch")
        _close(a, b, 1e-5)


def _default(switch: str):
    import dataclasses

    from tokenrouter.engine.config import EngineConfig

    return next(f.default for f in dataclasses.fields(EngineConfig) if f.name == switch)


def _interpret() -> int:
    from triton.runtime.interpreter import InterpretedFunction

    from tokenrouter.engine import triton_ops as tops

    if not isinstance(tops._rms_norm_kernel, InterpretedFunction):
        print("TRITON_INTERPRET=1 did not take effect", file=sys.stderr)
        return 2
    # Runtime-bound loops of the attention kernels under numpy >= 2.4 (see test_attention.py).
    from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

    patch_interpreter_for_numpy24()  # runtime-bound loops under numpy >= 2.4
    checks = [(_check_rms_norm, (d, n)) for d in (torch.float32, torch.bfloat16) for n in (64, 48)]
    checks += [(_check_rms_norm_gather, (d,)) for d in (torch.float32, torch.bfloat16)]
    checks += [
        (_check_qk_norm_rope_store, (d, hd, norm))
        for d in (torch.float32, torch.bfloat16)
        for hd, norm in ((16, True), (12, True), (16, False))
    ]
    # Heads sharing a program: 6 heads as 2 x 4 (the second program's last two rows past the heads), 3 x 2, 1 x 8
    checks += [(_check_qk_norm_rope_store, (torch.float32, 16, norm, hp)) for hp in (2, 4, 8) for norm in (True, False)]
    checks.append((_check_rope_heads_rule, ()))
    checks += [(_check_silu_and_mul, (d,)) for d in (torch.float32, torch.bfloat16)]
    checks.append((_check_step_kernels, ()))
    checks.append((_check_attention_row_slots, ()))
    checks.append((_check_model_matches_hf, ()))
    checks.append((_check_warm_rope_heads, ()))
    checks.append((_check_switches_match_hf_and_count_kernels, ()))
    checks.append((_check_varlen_graph_prefill_beside_decode_rows, ()))
    checks.append((_check_varlen_extend_fused_merge, ()))
    # Qwen3 (q/k norm) only: the kernel tests of interp_attention.py cover the no-norm path (about 30 s each here).
    checks.append((_check_decode_fused_rope, ("qwen3",)))
    failed = 0
    for fn, args in checks:
        try:
            fn(tops, *args)
            print("ok  ", fn.__name__, args)
        except Exception as e:
            failed += 1
            print("FAIL", fn.__name__, args, f"{type(e).__name__}: {e}")
    return 1 if failed else 0


def _aot_compile() -> int:
    """Lower each kernel (bf16, Qwen3-8B shapes) to sm_90 PTX and assemble it with Triton's bundled ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokenrouter.engine import triton_ops as T

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        print("this triton build has no bundled ptxas", file=sys.stderr)
        return 2
    ptr = dict.fromkeys(["X", "R", "W", "Y", "RO", "QKV", "NormW", "Q", "KC", "VC"], "*bf16")
    ptr.update(Pos="*i32", CosSin="*fp32", Slots="*i64", Idx="*i32")
    norm = {"HAS_RES": True, "STORE_SUM": True, "GATHER": False, "BLOCK": 4096, "USE_PDL": False}
    rope = {"NUM_Q": 32, "NUM_KV": 8, "HEAD_DIM": 128, "HALF": 64, "BLOCK_H": 64, "HAS_NORM": True, "HEADS": 1}
    cases = [
        (T._rms_norm_kernel, norm, 16),
        (T._rms_norm_kernel, {**norm, "HAS_RES": False, "STORE_SUM": False, "BLOCK": 8192}, 16),
        # embedding gather into the first norm; last residual add + logit-row gather + final norm; with PDL
        (T._rms_norm_kernel, {**norm, "HAS_RES": False, "GATHER": True, "USE_PDL": True}, 16),
        (T._rms_norm_kernel, {**norm, "STORE_SUM": False, "GATHER": True, "USE_PDL": True}, 16),
        (T._qk_norm_rope_store_kernel, {**rope, "USE_PDL": False}, 1),
        (T._qk_norm_rope_store_kernel, {**rope, "USE_PDL": True}, 1),
        (T._qk_norm_rope_store_kernel, {**rope, "USE_PDL": True, "HEADS": 16}, 16),
        (T._silu_and_mul_kernel, {"BLOCK": 1024, "USE_PDL": False}, 4),
        (T._silu_and_mul_kernel, {"BLOCK": 1024, "USE_PDL": True}, 4),
    ]
    # The step's two in-graph kernels: prologue (page writes, from_prev tokens) and sampling (bf16 logits, fp32
    # sampling parameters from the packed int32 buffer viewed as float).
    from tokenrouter.engine import triton_step as S

    ptr.update(Logits="*bf16", InvT="*fp32", TopP="*fp32", LpF="*fp32")
    ptr.update(dict.fromkeys(["TopK", "Seed", "Out", "OutSlot", "SlotTok", "Table", "UpdIdx", "UpdVal", "Ids",
                              "Prev", "LpK1", "LpI"], "*i32"))  # fmt: skip
    ptr["Greedy"] = "*i64"
    ptr["Pos"] = "*i32"
    ptr.update(PartV="*fp32", PartI="*i32")
    sample = {"BLOCK": 2048, "LP_WORDS": 41, "LP_TOP": 20, "NCHUNK": 0, "NCHUNK_P2": 1}
    cases += [
        (S._prologue_kernel, {"BLOCK": 256, "USE_PDL": False}, 4),
        (S._prologue_kernel, {"BLOCK": 256, "USE_PDL": True}, 4),
        (S._sample_kernel, {**sample, "USE_PDL": False}, 8),
        (S._sample_kernel, {**sample, "USE_PDL": True}, 8),
        # the chunked greedy argmax (Qwen3's 151,936-token vocabulary in chunks of 1024) and its merge
        (S._argmax_chunks_kernel, {"CHUNK": 1024, "NCHUNK": 149, "USE_PDL": True}, 4),
        (S._sample_kernel, {**sample, "USE_PDL": True, "NCHUNK": 149, "NCHUNK_P2": 256}, 8),
    ]
    for fn, constexprs, warps in cases:
        sig = {n: "constexpr" if n in constexprs else ptr.get(n, "fp32" if n == "eps" else "i32") for n in fn.arg_names}
        if constexprs.get("NCHUNK") and "Greedy" in sig:
            sig["Greedy"] = "*i32"  # the chunk indices
        kernel = triton.compile(
            ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
        )
        ptx = kernel.asm["ptx"]
        if constexprs["USE_PDL"] != ("griddepcontrol.wait" in ptx):
            print(f"{fn.__name__} {constexprs}: griddepcontrol.wait misplaced", file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory() as tmp:  # a directory of this run's own: suites may run side by side
            path = os.path.join(tmp, f"tr_{fn.__name__}.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            subprocess.run([ptxas, "--gpu-name", "sm_90a", path, "-o", os.devnull], check=True)
        print("ok", fn.__name__, constexprs)
    return 0


if __name__ == "__main__":
    sys.exit(_interpret() if sys.argv[1:] == ["--interpret"] else _aot_compile())
