"""The Triton skinny GEMM (`tokenrouter.engine.triton_gemv`): the kernel against a float64 matmul in Triton's
CPU interpreter (both inner products, split-K, N and K tails, bias, the SiLU fold), the engine with
`triton_gemv` on against HF on the padded graph path, its launch count, and an ahead-of-time sm_90 compile of
the production configs (16-byte loads, tensor cores, no spills, L2 prefetch before the PDL wait). Kernels run
in a fresh process (see test_engine_triton_ops._run_self)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# Qwen3 layer shapes (N, K): qkv, o, gate_up, down.
QWEN3_SHAPES = {
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "qwen3-32b": [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)],
}


def _run_self(flag: str, interpret: bool) -> None:
    from engine_testlib import run_self  # lazily: importing the engine early would fix Triton's mode here

    run_self(__file__, flag, interpret)


def test_skinny_gemm_and_engine_in_interpreter():
    _run_self("--interpret", interpret=True)


def test_skinny_gemm_compiles_for_sm90():
    _run_self("--aot", interpret=False)


def _measured_tile(G, m: int, n: int, k: int) -> tuple[bool, int, int] | None:
    """(dot, block_n, block_k) the small-M table names for M rows of an [n, k] weight, None where the rule holds."""
    return next(((dot, bn, bk) for rows, dot, bn, bk, _ in G.SMALL_M_TABLE.get((n, k), ()) if m <= rows), None)


def test_configs_for_qwen3_shapes():
    """Shape-only configs: FMA for one row, tensor cores above, except where the measured small-M table names a tile
    (then exactly that tile); every split a whole number of K tiles (no K masks on real shapes), and by the rule
    enough programs to cover the H200's 132 SMs unless the split cap is hit."""
    from tokenrouter.engine import triton_gemv as G

    for shapes in QWEN3_SHAPES.values():
        for n, k in shapes:
            for m in (1, 2, 3, 4, 5, 8, 16):
                cfg = G.gemv_config(m, n, k, 132)
                assert k % (cfg.split_k * cfg.block_k) == 0, (m, n, k, cfg)
                measured = _measured_tile(G, m, n, k) if m > G.FMA_MAX_ROWS else None
                if measured is not None:
                    assert (cfg.dot, cfg.block_n, cfg.block_k) == measured, (m, n, k, cfg)
                    continue
                assert cfg.dot == (m > G.FMA_MAX_ROWS)
                programs = -(-n // cfg.block_n) * cfg.split_k
                assert programs >= 128 or cfg.split_k == 8, (m, n, k, cfg)
                if not cfg.dot:
                    assert (n, k) not in G.FMA_TABLE or (cfg.block_n, cfg.block_k) == G.FMA_TABLE[(n, k)]
                else:
                    assert cfg.block_n >= 64 and G.prefetch_lines_per_row(k, cfg, 2) >= 1
    # tiny shapes clamp the tiles
    cfg = G.gemv_config(1, 24, 40)
    assert cfg.block_k == 64 and cfg.block_n <= 16
    assert G.num_counters(51200) * G.MIN_BLOCK_N >= 51200


# ---- interpreter checks (run in the subprocess) ---------------------------------------------------------------
def _ref(x, w, b, silu):
    if silu:
        k = w.shape[1]
        x = torch.nn.functional.silu(x[:, :k]) * x[:, k:]
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


def _check_kernel(G, cfg, m, n, k, silu, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * k if silu else k, generator=g)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    counters = torch.zeros(G.num_counters(n), dtype=torch.int32)
    y = torch.full((m, n), float("nan"))
    out = G.skinny_gemm(x, w, b, silu=silu, config=cfg, counters=counters, out=y)
    assert out is y and not y.isnan().any(), f"unwritten outputs {cfg} m={m} n={n} k={k}"
    ref = _ref(x, w, b, silu)
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    assert err < 1e-5, f"{cfg} m={m} n={n} k={k} silu={silu} bias={bias}: rel err {err:.2e}"
    assert counters.eq(0).all(), "split-K arrival counters not reset"


def _check_kernels(G):
    """fp32, M in 1..4 (and 16), non-power-of-two N (tails), K not a multiple of the tile or the split (masks),
    each inner product with and without split-K, bias, and the SiLU fold; plus the heuristic configs."""
    C = G.GemvConfig
    cases = [
        (C(dot=False, block_n=4, block_k=32), (1, 2)),  # FMA, 1 and 2 rows; K 80 -> masked last tile
        (C(dot=False, block_n=8, block_k=16, split_k=3), (1, 2, 3)),  # FMA + split-K (uneven splits)
        (C(dot=True, block_n=16, block_k=16), (1, 3, 4)),  # tensor-core path, rows padded to 16
        (C(dot=True, block_n=32, block_k=32, split_k=2), (2, 4, 16)),
    ]
    shapes = [(40, 64), (24, 80), (20, 48)]  # N 40/24/20 not multiples of every tile, K 80/48 tails
    seed = 0
    for cfg, ms in cases:
        for m in ms:
            for i, (n, k) in enumerate(shapes):
                seed += 1
                _check_kernel(G, cfg, m, n, k, silu=i == 1, bias=i != 0, seed=seed)
    for m in (1, 2, 4):  # heuristic configs on small shapes
        for n, k in ((48, 64), (36, 96)):
            seed += 1
            _check_kernel(G, None, m, n, k, silu=m == 2, bias=False, seed=seed)
    # more than 16 rows (varlen passes): one tensor-core row block of 32 / 64 rows, padded rows masked, split-K,
    # and the heuristic's wide tiles
    for cfg, m in ((C(dot=True, block_n=16, block_k=16), 17), (C(dot=True, block_n=16, block_k=32, split_k=2), 33),
                   (None, 40)):  # fmt: skip
        for i, (n, k) in enumerate(shapes[:2]):
            seed += 1
            _check_kernel(G, cfg, m, n, k, silu=i == 1, bias=i == 0, seed=seed)
    # bf16 plumbing on the FMA path (the interpreter truncates where GPUs round: loose tolerance). The
    # interpreter's tl.dot multiplies bf16 as raw uint16 (it stores bf16 that way), so the tensor-core path is
    # checked in fp32 here and in bf16 on the GPU (studies/engine/gemv_probe.py).
    for m in range(1, G.FMA_MAX_ROWS + 1):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
        w = torch.randn(40, 64, generator=torch.Generator().manual_seed(10)).bfloat16()
        y = G.skinny_gemm(x, w)
        assert y.dtype == torch.bfloat16 and not G.gemv_config(m, 40, 64).dot
        ref = x.double() @ w.double().T
        assert float((y.double() - ref).abs().max() / ref.abs().max()) < 2e-2
    fma = C(dot=False, block_n=4, block_k=32)
    for bad in (lambda: G.skinny_gemm(torch.randn(257, 64), torch.randn(8, 64)),
                lambda: G.skinny_gemm(torch.randn(17, 64), torch.randn(8, 64), config=fma),
                lambda: G.skinny_gemm(torch.randn(17, 64), torch.randn(8, 64), norm=(torch.ones(64), 1e-6)),
                lambda: G.skinny_gemm(torch.randn(2, 63), torch.randn(8, 64)),
                lambda: G.skinny_gemm(torch.randn(2, 64), torch.randn(8, 64), silu=True)):  # fmt: skip
        with pytest.raises(ValueError):
            bad()


def _check_preload(G):
    """Weight tiles loaded before the PDL wait (`preload`): bit-identical to the plain loop on every tile path
    (FMA, FMA + split-K, tensor cores with and without split-K), with K tails, one to four pre-loaded tiles and
    fewer tiles than pre-load slots (the last split's); the policy pre-loads whole K slices or nothing."""
    C = G.GemvConfig
    cases = [(C(dot=False, block_n=4, block_k=16), 1), (C(dot=False, block_n=8, block_k=16, split_k=3), 1),
             (C(dot=False, block_n=4, block_k=16), 3),  # FMA over several rows: the small-M table's tiles
             (C(dot=True, block_n=16, block_k=16), 3), (C(dot=True, block_n=32, block_k=16, split_k=2), 5)]  # fmt: skip
    g = torch.Generator().manual_seed(31)
    for cfg, m in cases:
        for n, k, silu in ((40, 64, False), (24, 80, True), (20, 40, False)):
            x = torch.randn(m, 2 * k if silu else k, generator=g)
            w = torch.randn(n, k, generator=g)
            ctr = torch.zeros(G.num_counters(n), dtype=torch.int32)
            plain = G.skinny_gemm(x, w, silu=silu, config=cfg, counters=ctr)
            slice_tiles = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k)  # K tiles of a split
            for tiles in (1, 2, 3, 4):  # pre-loaded tiles of 16 columns: part of the slice, all, more than all
                budget = G.pre_tiles(k, cfg, 4, max_bytes=tiles * cfg.block_n * cfg.block_k * 4)
                assert budget == (slice_tiles if slice_tiles <= tiles else 0)
                y = torch.full((m, n), float("nan"))
                G.skinny_gemm(x, w, silu=silu, config=cfg, counters=ctr, out=y, pre_tiles_override=tiles)
                assert torch.equal(y, plain), f"{cfg} m={m} n={n} k={k} pre={tiles}: differs from the plain loop"
            y = torch.full((m, n), float("nan"))
            G.skinny_gemm(x, w, silu=silu, config=cfg, counters=ctr, out=y, preload=True)
            assert torch.equal(y, plain)
            assert ctr.eq(0).all()


def _check_norm_fold(G):
    """The folded residual add + RMSNorm (`norm=`) against the `rms_norm` kernel then the plain skinny GEMM
    (bit-identical: same per-row reduction, same rounding points) and RMSNorm + a float64 matmul: every tile path,
    K tails, with and without a residual and pre-loaded tiles; the sum written once, exactly, never into x or r."""
    from tokenrouter.engine import triton_ops
    from tokenrouter.engine.layers import rms_norm_ref

    C = G.GemvConfig
    cases = [(C(dot=False, block_n=4, block_k=32), 1), (C(dot=False, block_n=8, block_k=16, split_k=3), 1),
             (C(dot=True, block_n=16, block_k=16), 3), (C(dot=True, block_n=32, block_k=32, split_k=2), 5),
             (None, 1), (None, 4)]  # fmt: skip
    g = torch.Generator().manual_seed(21)
    for i, (cfg, m) in enumerate(cases):
        for n, k in ((40, 64), (24, 80)):
            x, r = torch.randn(m, k, generator=g), torch.randn(m, k, generator=g)
            w, nw = torch.randn(n, k, generator=g), torch.rand(k, generator=g) + 0.5
            x0, r0 = x.clone(), r.clone()
            res = i % 2 == 0
            s_out = torch.full((m, k), float("nan")) if res else None
            ctr = torch.zeros(G.num_counters(n), dtype=torch.int32)
            for preload in (False, True):
                y = torch.full((m, n), float("nan"))
                G.skinny_gemm(x, w, config=cfg, counters=ctr, out=y, norm=(nw, 1e-6), residual=r if res else None,
                              sum_out=s_out, preload=preload)  # fmt: skip
                s = x + r if res else x
                ref = rms_norm_ref(s.double(), nw.double(), 1e-6) @ w.double().T
                err = float((y.double() - ref).abs().max() / ref.abs().max())
                assert not y.isnan().any() and err < 1e-5, f"{cfg} m={m} n={n} k={k} res={res}: rel err {err:.2e}"
                h, s2 = triton_ops.rms_norm(x, nw, 1e-6, r if res else None)
                two = G.skinny_gemm(h, w, config=cfg, counters=ctr)
                assert torch.equal(y, two), f"{cfg} m={m} n={n} k={k}: fold differs from norm + GEMM"
                assert torch.equal(x, x0) and torch.equal(r, r0)
                if res:
                    assert torch.equal(s_out, s2), f"{cfg} m={m}: sum not written exactly"
    with pytest.raises(ValueError):
        G.skinny_gemm(torch.randn(2, 64), torch.randn(8, 64), norm=(torch.ones(64), 1e-6), residual=torch.randn(2, 64))


def _check_late_norm(G):
    """`norm_late` (the RMS applied after the K loop) against RMSNorm + a float64 matmul on every tile path (FMA and
    tensor cores, split-K, K tails, pre-loaded tiles), with and without a residual: in fp32 close to the reference,
    in bf16 as close as the exact fold; the sum x + r written once, as the `rms_norm` kernel writes it (the
    interpreter's bf16 casts are not torch's), never into x or r."""
    from tokenrouter.engine import triton_ops
    from tokenrouter.engine.layers import rms_norm_ref

    C = G.GemvConfig
    cases = [(C(dot=False, block_n=4, block_k=32), 2), (C(dot=False, block_n=8, block_k=16, split_k=3), 3),
             (C(dot=True, block_n=16, block_k=16), 3), (C(dot=True, block_n=32, block_k=32, split_k=2), 5),
             (C(dot=True, block_n=16, block_k=16, split_k=4), 8), (None, 4)]  # fmt: skip
    g = torch.Generator().manual_seed(23)
    for i, (cfg, m) in enumerate(cases):
        for n, k in ((40, 64), (24, 80)):
            res = i % 2 == 0
            for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, None)):
                x, r = torch.randn(m, k, generator=g).to(dtype), torch.randn(m, k, generator=g).to(dtype)
                w, nw = torch.randn(n, k, generator=g).to(dtype), (torch.rand(k, generator=g) + 0.5).to(dtype)
                x0, r0 = x.clone(), r.clone()
                s_out = torch.full((m, k), float("nan"), dtype=dtype) if res else None
                ctr = torch.zeros(G.num_counters(n), dtype=torch.int32)
                for preload in (False, True):
                    y = torch.full((m, n), float("nan"), dtype=dtype)
                    G.skinny_gemm(x, w, config=cfg, counters=ctr, out=y, norm=(nw, 1e-6), residual=r if res else None,
                                  sum_out=s_out, preload=preload, norm_late=True)  # fmt: skip
                    s = (x.double() + r.double()).to(dtype) if res else x
                    ref = rms_norm_ref(s.double(), nw.double(), 1e-6) @ w.double().T
                    err = float((y.double() - ref).abs().max() / ref.abs().max())
                    if tol is None:  # bf16: no worse than the exact fold's rounding (twice, for its other order)
                        exact = G.skinny_gemm(x, w, config=cfg, counters=ctr, norm=(nw, 1e-6),
                                              residual=r if res else None,
                                              sum_out=torch.empty_like(x) if res else None)  # fmt: skip
                        tol = 2 * float((exact.double() - ref).abs().max() / ref.abs().max()) + 1e-3
                    assert not y.isnan().any() and err < tol, f"{cfg} m={m} n={n} k={k} {dtype}: rel err {err:.2e}"
                    assert torch.equal(x, x0) and torch.equal(r, r0)
                    if res:
                        _, s2 = triton_ops.rms_norm(x, nw, 1e-6, r)
                        assert torch.equal(s_out, s2), f"{cfg} m={m} {dtype}: sum not written exactly"
                    assert ctr.eq(0).all()


def _run_counting_rows(G, scn, plan):
    """Run `plan` on the scenario; (the scenario, the row count of every `skinny_gemm` launch, in order)."""
    calls: list[int] = []
    real = G.skinny_gemm

    def spy(x, *a, **kw):
        calls.append(x.shape[0])
        return real(x, *a, **kw)

    G.skinny_gemm = spy
    try:
        for _ in scn.run(plan):
            pass
    finally:
        G.skinny_gemm = real
    return scn, calls


def _check_engine_matches_hf(G):
    """The engine with `triton_gemv` on (graph path emulated on CPU, Triton elementwise ops) matches HF over the
    whole scenario, launching the skinny GEMM only in graph steps of <= gemv_max_rows tokens (eager steps and
    larger buckets keep cuBLAS); SwiGLU folded into the down projection saves one launch per layer."""
    from pathlib import Path

    from engine_testlib import PLAN, Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

    from tokenrouter.core.batch import Batch, BatchRow
    from tokenrouter.core.request import Request
    from tokenrouter.engine.launch_count import LaunchCounter, count_graph_body_launches

    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=14)
        # torch attention keeps the interpreter run short; only the projections change here
        # the SiLU fold alone here (the norm fold: _check_engine_speed_switches); decode graphs alone (varlen passes:
        # _check_engine_varlen_wide_rows)
        eng = tiny_engine(tmp, ops_backend="triton", graph_emulation=True, triton_gemv=True, gemv_max_rows=4,
                          gemv_fold_norm=False, gemv_varlen_max_rows=0)  # fmt: skip
        assert eng.gemv_enabled and eng.model.gemv.ops is G
        # graph buckets 1 and 2 (FMA path), 4 with a padding row and a 2-token extend row (tensor-core path)
        plan = [
            *PLAN[:4],
            [("a", 1, True, [])],
            [("b", 1, True, []), ("c", 1, True, [])],
            [("d", 1, True, []), ("a", 1, True, []), ("b", 1, True, [])],
            [("c", None, True, [7]), ("d", 1, True, [])],
            [("a", 1, True, []), ("b", 1, True, []), ("c", 1, True, []), ("d", None, True, [1, 2, 3, 4, 5, 6])],
        ]
        scn, calls = _run_counting_rows(G, Scenario(eng, seed=14), plan)
        check_against_hf(scn, hf, tol=1e-4)
        assert calls and set(calls) == {1, 2, 4}, sorted(set(calls))  # graph buckets <= gemv_max_rows only

        req = Request("x", list(range(1, 21)), 20)
        assert eng.kv_pool.grow(req.pages, 22)
        with LaunchCounter(eng.model) as lc:  # eager prefill: cuBLAS (torch.mm) only
            eng.step(Batch(0, 0, [BatchRow(req, 0, 20)]))
        assert not any("skinny" in name for _, name in lc.events), lc.events
        # One b=1 decode graph body: 4 skinny GEMMs and no SwiGLU kernel; switched off (graphs re-built), cuBLAS
        # and SwiGLU again: one launch more per layer (with Triton attention: 8 vs 9, test_engine_triton_ops).
        req.num_computed = 20
        req.token_ids.append(5)
        lc_on = count_graph_body_launches(eng, Batch(0, 1, [BatchRow(req, 20, 1)]))
        on = lc_on.layer_kernels(1)
        assert sum("skinny_gemm" in k for k in on) == 4 and not any("silu" in k for k in on), on
        eng.set_triton_gemv(False)
        assert not eng.gemv_enabled
        req.num_computed = 21
        req.token_ids.append(6)
        lc_off = count_graph_body_launches(eng, Batch(0, 2, [BatchRow(req, 21, 1)]))
        off = lc_off.layer_kernels(1)
        assert not any("skinny" in k for k in off) and sum("silu" in k for k in off) == 1, off
        assert [n - 1 for n in lc_off.per_layer()] == lc_on.per_layer(), (lc_on.sections, lc_off.sections)
        assert eng.model.gemv.counters.eq(0).all()


def _check_engine_varlen_wide_rows(G):
    """`gemv_varlen_max_rows`: the varlen graph passes (emulated) of up to that many tokens take the skinny GEMM's
    tensor-core tiles past 16 rows, decode graphs keep `gemv_max_rows`, eager passes cuBLAS; the scenario still
    matches HF, and with 0 (the default) no varlen pass launches the skinny GEMM."""
    from pathlib import Path

    from engine_testlib import PLAN, Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

    # and a last step of 30 tokens (peer returns of 20 and 8 tokens): a varlen pass past 16 rows
    plan = [*PLAN, [("a", None, True, list(range(1, 21))), ("b", None, True, list(range(30, 38)))]]
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=16)
        for wide in (64, 0):
            eng = tiny_engine(tmp, ops_backend="triton", graph_emulation=True, gemv_max_rows=4,
                              gemv_fold_norm=False, gemv_varlen_max_rows=wide, max_num_batched_tokens=64)  # fmt: skip
            scn, calls = _run_counting_rows(G, Scenario(eng, seed=16), plan)
            check_against_hf(scn, hf, tol=1e-4)
            big = sorted({m for m in calls if m > 4})
            if wide:
                assert big and max(big) <= wide and any(m > G.MAX_ROWS for m in big), sorted(set(calls))
            else:
                assert not big, sorted(set(calls))
            assert eng.model.gemv.counters.eq(0).all()


SPEED_SWITCHES = {"gemv_preload": True, "gemv_fold_norm": True, "gemv_lm_head": True, "argmax_chunk": 64}


def _scenario_and_launches(tmp: str, hf, seed: int, **engine_kw):
    """(engine, the scenario's records checked against HF, [(rows, launches per layer, launches outside the layers)]
    of graph decode steps of one row and of three) for a tiny Triton engine with `engine_kw`."""
    from engine_testlib import Scenario, check_against_hf, tiny_engine

    from tokenrouter.core.batch import Batch, BatchRow
    from tokenrouter.core.request import Request
    from tokenrouter.engine.launch_count import count_graph_body_launches

    eng = tiny_engine(tmp, ops_backend="triton", attention_backend="triton", graph_emulation=True,
                      decode_num_splits=3, **engine_kw)  # fmt: skip
    scn = Scenario(eng, seed=seed)
    scn.finish()
    check_against_hf(scn, hf, tol=1e-4)
    reqs = [Request(f"x{i}", list(range(1 + i, 21 + i)), 20) for i in range(3)]
    for i, req in enumerate(reqs):
        assert eng.kv_pool.grow(req.pages, 21)
        eng.step(Batch(0, i, [BatchRow(req, 0, 20)]))
        req.num_computed = 20
        req.token_ids.append(5)
    counts = []
    for rows in (1, 3):
        lc = count_graph_body_launches(eng, Batch(0, 9, [BatchRow(r, 20, 1) for r in reqs[:rows]]))
        counts.append((rows, lc.per_layer(), len(lc.sections["step"])))
    assert eng.model.gemv.counters.eq(0).all() and eng.split_counters.eq(0).all()
    return eng, scn.records, counts


def _check_engine_speed_switches(G):
    """The engine with the decode-step switches on (weight tiles before the wait, norms folded into the qkv and
    gate|up projections, older keys before the wait, the chunked greedy argmax) and off (emulated graphs,
    Triton ops and attention): the same greedy tokens and logits to fp32 rounding through the whole scenario,
    both against HF; two launches fewer per decode layer (one in the first, whose norm gathers the embedding), in
    steps of one row and of three."""
    from pathlib import Path

    from engine_testlib import make_hf_checkpoint, rel_err

    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=15)
        runs, counts = [], []
        for on in (True, False):
            sw = SPEED_SWITCHES if on else dict.fromkeys(SPEED_SWITCHES, False) | {"argmax_chunk": 0}
            eng, records, c = _scenario_and_launches(tmp, hf, 15, **sw)
            assert eng.model.gemv.fold_norm is on and eng.model.gemv.preload is on
            runs.append(records)
            counts += c  # the norms fold only into one-row steps (`norm_fold_max_rows`)
        for a, b in zip(*runs, strict=True):
            assert a.token == b.token and rel_err(a.logits, b.logits) < 1e-5, (a.rid, a.pos)
        assert counts == [(1, [7, 6], 5), (3, [8, 8], 5), (1, [8, 8], 5), (3, [8, 8], 5)], counts


def _check_engine_late_norm(G):
    """`gemv_late_norm_max_rows`: the engine's steps of 2-8 rows fold their norms with the RMS applied last: the
    scenario against HF (fp32: to rounding) and two launches fewer per layer in a step of three rows (the first
    layer's norm gathers the embedding: one fewer there); one-row steps as before. (The same engine without it is
    `_check_engine_speed_switches`' first run: 8 launches a layer at three rows.)"""
    from pathlib import Path

    from engine_testlib import make_hf_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=16)
        _, _, counts = _scenario_and_launches(tmp, hf, 16, gemv_late_norm_max_rows=8, **SPEED_SWITCHES)
        assert [(rows, per_layer) for rows, per_layer, _ in counts] == [(1, [7, 6]), (3, [7, 6])], counts


def _interpret() -> int:
    from triton.runtime.interpreter import InterpretedFunction

    from tokenrouter.engine import triton_gemv as G

    if not isinstance(G.skinny_gemm_kernel, InterpretedFunction):
        print("TRITON_INTERPRET=1 did not take effect", file=sys.stderr)
        return 2
    from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

    patch_interpreter_for_numpy24()  # runtime-bound loops under numpy >= 2.4
    failed = 0
    checks = (_check_kernels, _check_preload, _check_norm_fold, _check_late_norm, _check_engine_matches_hf,
              _check_engine_speed_switches, _check_engine_late_norm, _check_engine_varlen_wide_rows)  # fmt: skip
    for fn in checks:
        try:
            fn(G)
            print("ok  ", fn.__name__)
        except Exception as e:
            failed += 1
            print("FAIL", fn.__name__, f"{type(e).__name__}: {e}")
    return 1 if failed else 0


# ---- ahead-of-time sm_90 compile -------------------------------------------------------------------------------
def aot_variants():
    """(label, m, n, k, silu, pdl, preload, norm): one of each distinct kernel the engine compiles for Qwen3 (FMA
    tiles at 1 and 2 rows, tensor-core tiles with and without split-K, the SiLU and norm folds (norm "late": the
    RMS applied last), PDL with the L2 prefetch or with weight tiles pre-loaded before the wait)."""
    return [
        ("0.6b qkv M=1", 1, 4096, 1024, False, False, False, False),
        ("8b gate_up M=1 pdl", 1, 24576, 4096, False, True, False, False),
        ("8b down+silu M=1 pdl", 1, 4096, 12288, True, True, False, False),
        ("8b qkv M=2 pdl", 2, 6144, 4096, False, True, False, False),
        ("32b down+silu M=2 pdl", 2, 5120, 25600, True, True, False, False),
        ("8b o M=8 (split-K)", 8, 4096, 4096, False, False, False, False),
        ("32b gate_up M=16 pdl", 16, 51200, 5120, False, True, False, False),
        ("0.6b down+silu M=8 pdl (split-K)", 8, 1024, 3072, True, True, False, False),
        ("0.6b o M=1 pdl preload", 1, 1024, 2048, False, True, True, False),
        ("0.6b down+silu M=1 pdl preload", 1, 1024, 3072, True, True, True, False),
        ("0.6b o M=8 pdl preload (split-K)", 8, 1024, 2048, False, True, True, False),
        ("32b gate_up M=8 pdl preload", 8, 51200, 5120, False, True, True, False),
        ("0.6b norm+qkv M=1 pdl preload", 1, 4096, 1024, False, True, True, True),
        ("0.6b norm+gate_up M=1 pdl preload", 1, 6144, 1024, False, True, True, True),
        ("0.6b norm+gate_up M=8 pdl preload", 8, 6144, 1024, False, True, True, True),
        ("0.6b late norm+qkv M=2 pdl preload (FMA)", 2, 4096, 1024, False, True, True, "late"),
        ("0.6b late norm+qkv M=8 pdl (split-K)", 8, 4096, 1024, False, True, False, "late"),
        ("0.6b late norm+gate_up M=4 pdl (split-K)", 4, 6144, 1024, False, True, False, "late"),
        ("8b late norm+gate_up M=8 pdl", 8, 24576, 4096, False, True, False, "late"),
        ("0.6b qkv M=2 pdl preload (measured FMA tile)", 2, 4096, 1024, False, True, True, False),
        ("0.6b o M=4 pdl preload (measured FMA tile)", 4, 1024, 2048, False, True, True, False),
        ("0.6b down+silu M=2 pdl preload (measured FMA tile)", 2, 1024, 3072, True, True, True, False),
        ("0.6b down+silu M=48 pdl (wide rows)", 48, 1024, 3072, True, True, False, False),
        ("32b qkv M=96 pdl (wide rows)", 96, 10240, 5120, False, True, False, False),
        ("32b o M=256 pdl (wide rows, split-K)", 256, 5120, 8192, False, True, False, False),
        ("32b down M=192 pdl (wide rows)", 192, 5120, 25600, False, True, False, False),
    ]


def _aot_compile() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokenrouter.engine import triton_gemv as G

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas, cuobjdump = os.path.join(bindir, "ptxas"), os.path.join(bindir, "cuobjdump")
    if not (os.path.exists(ptxas) and os.path.exists(cuobjdump)):
        print("this triton build has no bundled ptxas/cuobjdump", file=sys.stderr)
        return 2
    fn = G.skinny_gemm_kernel
    ptr = {"X": "*bf16", "W": "*bf16", "Bias": "*bf16", "Y": "*bf16", "Part": "*fp32", "Counters": "*i32",
           "R": "*bf16", "NW": "*bf16", "RO": "*bf16", "SS": "*fp32", "eps": "fp32"}  # fmt: skip
    divisible = {"N", "K", "K_SPLIT", "stride_xm", "stride_wn", "stride_ym", "stride_rm", "stride_rom"}
    bad = 0
    for label, m, n, k, silu, pdl, preload, norm in aot_variants():
        cfg = G.gemv_config(m, n, k, 132)
        pf = G.prefetch_lines_per_row(k, cfg, 2) if pdl and not preload else 0
        pre = (G.pre_tiles(k, cfg, 2) or 2) if preload else 0  # the variant compiles the pre-load path either way
        consts, _ = G.kernel_constexprs(m, n, k, cfg, silu=silu, bias=False, dtype=torch.bfloat16, pdl=pdl,
                                        prefetch_lines=pf, pre_tiles=pre, norm=bool(norm), norm_res=bool(norm),
                                        norm_late=norm == "late")  # fmt: skip
        sig = {a: "constexpr" if a in consts else ptr.get(a, "i32") for a in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                 if sig[a].startswith("*") or a in divisible}  # fmt: skip
        kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})  # fmt: skip
        with tempfile.TemporaryDirectory() as d:
            src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
            with open(src, "w") as f:
                f.write(kernel.asm["ptx"])
            info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", src, "-o", cubin],
                                  capture_output=True, text=True, check=True).stderr  # fmt: skip
            sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        spill = re.search(r"(\d+) bytes spill stores", info)
        spill = int(spill.group(1)) if spill else 0
        wide = len(re.findall(r"LDGSTS\.E\.BYPASS\.128|LDG\.E\.128", sass))
        problems = []
        if spill:
            problems.append(f"{spill} B spilled")
        if not wide:
            problems.append("no 16-byte weight loads")
        if cfg.dot and "HGMMA" not in sass:
            problems.append("no wgmma")
        early = 0
        if pdl:
            wait = sass.find("ACQBULK")  # griddepcontrol.wait
            early = len(re.findall(r"LDG\.E\.(?:64|128)", sass[: max(wait, 0)]))
            if wait < 0:
                problems.append("no griddepcontrol.wait")
            elif pf and not 0 <= sass.find("CCTL.E.PF2") < wait:
                problems.append("L2 prefetch missing or after the wait")
            elif pre and early == 0:
                problems.append("no weight load before the wait")
        bad += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {label:34s} {cfg} regs={regs} 16B-loads={wide} "
              f"prefetch_lines={pf} pre_tiles={pre} loads-before-wait={early} {'; '.join(problems)}")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(_interpret() if sys.argv[1:] == ["--interpret"] else _aot_compile())


def test_engine_preloads_fma_tiles_at_any_rows_and_tensor_core_tiles_only_at_one(monkeypatch):
    """GemvState.linear: the config it launches is `gemv_config`'s, and weight tiles are pre-loaded for FMA tiles
    (Qwen3-0.6B's qkv at 2 rows: the measured table) but not for tensor-core tiles (8 rows), which lose from it."""
    from types import SimpleNamespace

    from tokenrouter.engine import triton_gemv as G
    from tokenrouter.engine.layers import GemvState

    calls = []
    ops = SimpleNamespace(gemv_config=G.gemv_config, device_sms=G.device_sms,
                          skinny_gemm=lambda *a, **kw: calls.append(kw))  # fmt: skip
    state = GemvState(ops=ops, counters=torch.zeros(1), enabled=True, active=True, preload=True)
    w = torch.empty(4096, 1024, device="meta")
    for m in (1, 2, 8):
        state.linear(torch.empty(m, 1024, device="meta"), w, None)
    assert [kw["config"].dot for kw in calls] == [False, False, True]
    assert [kw["preload"] for kw in calls] == [True, True, False]
    state.preload = False
    state.linear(torch.empty(2, 1024, device="meta"), w, None)
    assert calls[-1]["preload"] is False
