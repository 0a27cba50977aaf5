#!/usr/bin/env python
"""The projections of varlen passes of 17-256 tokens: cuBLAS against the skinny GEMM's tensor-core tiles (issue 30).

    python studies/engine/wide_gemm.py --out OUT_DIR          # one H200: ~3 min
    TRITON_INTERPRET=1 python studies/engine/wide_gemm.py --out OUT_DIR --smoke   # CPU, checks the script

A large model's visit in routed serving is a varlen pass of B rows of ~10 tokens (48-128 tokens at N = 8-16):
too few tokens for compute to matter (the weights stream once), too many for the decode GEMV. Per model projection
(Qwen3-32B and Qwen3-0.6B: qkv, o, gate|up, down; the 0.6B's down with SwiGLU folded, as the engine launches it)
and token count M, this times cuBLAS (`F.linear`, after `silu_and_mul` where the engine folds SwiGLU), the
engine's own tile (`gemv_config`) and a grid of tensor-core tiles (weight rows block_n x K tile block_k, stages,
warps) with split-K chosen to fill one, two or four waves of programs, each captured in a CUDA graph over enough
weight copies to miss L2. Every tile's output is checked against cuBLAS's.

Writes OUT_DIR/wide_gemm.json and prints, per M, the best tile per projection and the best single rule over the
32B's four projections.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_device import exit_status, kernel_args, kernel_setup
from tma_gemm import tma_gemm

from tokenrouter.engine import triton_gemv as tg
from tokenrouter.engine.triton_ops import silu_and_mul

SHAPES = {  # model -> [(op, N, K, silu)]: the engine's weights (K is the weight's; x is [M, 2K] with silu)
    "qwen3-32b": [("qkv", 10240, 5120, False), ("o", 5120, 8192, False), ("gate_up", 51200, 5120, False),
                  ("down", 5120, 25600, False)],
    "qwen3-0.6b": [("qkv", 4096, 1024, False), ("o", 1024, 2048, False), ("gate_up", 6144, 1024, False),
                   ("down_silu", 1024, 3072, True)],
}  # fmt: skip
SMOKE_SHAPES = {"tiny": [("qkv", 96, 64, False), ("down_silu", 32, 128, True)]}
ROWS = (24, 32, 48, 64, 96, 128, 192, 256)
SMOKE_ROWS = (17, 40)
TILES = [  # (name, block_n, block_k, stages, warps)
    ("n64k64s4w4", 64, 64, 4, 4),
    ("n64k64s6w4", 64, 64, 6, 4),
    ("n64k128s3w4", 64, 128, 3, 4),
    ("n64k128s4w4", 64, 128, 4, 4),
    ("n128k64s4w4", 128, 64, 4, 4),
    ("n128k64s4w8", 128, 64, 4, 8),
    ("n64k64s3w8", 64, 64, 3, 8),
    ("n128k128s3w8", 128, 128, 3, 8),
]
SMOKE_TILES = [("n16k16s2w4", 16, 16, 2, 4), ("n32k32s2w4", 32, 32, 2, 4)]
TMA_TILES = [  # the same grid through `tma_gemm` (TMA loads; projections without SwiGLU folded)
    ("tma_n64k64s6w4", 64, 64, 6, 4),
    ("tma_n128k64s4w4", 128, 64, 4, 4),
    ("tma_n128k64s4w8", 128, 64, 4, 8),
    ("tma_n128k128s3w8", 128, 128, 3, 8),
]
SMOKE_TMA_TILES = [("tma_n16k16s2w4", 16, 16, 2, 4)]
WAVES = (1, 2, 4)  # split-K until the grid holds this many programs per SM
SMEM_LIMIT = 220 * 1024
L2_MISS_BYTES = 200e6


def split_for(n_tiles: int, k: int, block_k: int, programs: int, max_split: int = 16) -> int:
    """Smallest power-of-two split-K giving >= `programs` programs, every split >= 2 whole K tiles."""
    s = 1
    while n_tiles * s < programs and s < max_split and k % (2 * s * block_k) == 0 and k // (2 * s) >= 2 * block_k:
        s *= 2
    return s


def fits(m: int, bn: int, bk: int, stages: int, warps: int) -> bool:
    """Shared memory of the pipeline (weight + x tiles) and the fp32 accumulator's registers per thread."""
    bm = tg.dot_rows(m)
    return stages * (bn + bm) * bk * 2 <= SMEM_LIMIT and bn * bm // (32 * warps) <= 128


def candidates(m: int, n: int, k: int, sms: int, tiles: list) -> list[tuple[str, tg.GemvConfig]]:
    """("engine", the engine's config), then every tile that fits at each split-K of WAVES (names `<tile>_s<split>`)."""
    out = [("engine", tg.gemv_config(m, n, k, sms))]
    for name, bn, bk, stages, warps in tiles:
        if not fits(m, bn, bk, stages, warps) or k % bk:
            continue
        seen = set()
        for w in WAVES:
            s = split_for(math.ceil(n / bn), k, bk, w * sms)
            if s in seen:
                continue
            seen.add(s)
            out.append((f"{name}_s{s}", tg.GemvConfig(dot=True, block_n=bn, block_k=bk, split_k=s, num_warps=warps,
                                                      num_stages=stages)))  # fmt: skip
    return out


def time_shape(model: str, op: str, n: int, k: int, silu: bool, rows: tuple[int, ...], dev: torch.device,
               dt: torch.dtype, sms: int, tiles: list, tma_tiles: list,
               deadline: float) -> list[dict[str, Any]]:  # fmt: skip
    cuda = dev.type == "cuda"
    if cuda:
        import graph_timing as gt
    wbytes = n * k * 2
    copies = max(1, min(16, math.ceil(L2_MISS_BYTES / wbytes))) if cuda else 1
    gen = torch.Generator(device=dev).manual_seed(n * 7 + k)
    ws = [(torch.randn(n, k, device=dev, generator=gen, dtype=torch.float32) * k**-0.5).to(dt) for _ in range(copies)]
    counters = tg.arrival_counters(n, dev)
    out: list[dict[str, Any]] = []
    for m in rows:
        if time.perf_counter() > deadline:
            out.append({"model": model, "op": op, "m": m, "skipped": True})
            continue
        x = torch.randn(m, 2 * k if silu else k, device=dev, generator=gen, dtype=torch.float32).to(dt)
        xs = silu_and_mul(x) if silu else x
        ref = F.linear(xs, ws[0]).float()
        y = torch.empty(m, n, device=dev, dtype=dt)

        def cublas(x: torch.Tensor = x, y: torch.Tensor = y) -> None:
            for w in ws:
                torch.mm(silu_and_mul(x) if silu else x, w.t(), out=y)

        base = {"model": model, "op": op, "m": m, "n": n, "k": k, "copies": copies}
        recs = [{**base, "variant": "cublas"}]
        if cuda:
            recs[0]["us"] = gt.capture_and_time(cublas, n=10, per=copies).median_us
        cands = candidates(m, n, k, sms, tiles)
        cands += [] if silu else [c for c in candidates(m, n, k, sms, tma_tiles) if c[0] != "engine"]
        for name, cfg in cands:
            rec = {**base, "variant": name, "block_n": cfg.block_n, "block_k": cfg.block_k, "split_k": cfg.split_k,
                   "stages": cfg.num_stages, "warps": cfg.num_warps, "dot": cfg.dot}  # fmt: skip
            try:
                launch(name, x, ws[0], y, cfg, silu, counters, pdl=cuda)
                rec["err"] = float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                if cuda:

                    def run(name: str = name, cfg: tg.GemvConfig = cfg, x: torch.Tensor = x, y: torch.Tensor = y):
                        for w in ws:
                            launch(name, x, w, y, cfg, silu, counters, pdl=True)

                    rec["us"] = gt.capture_and_time(run, n=10, per=copies).median_us
            except Exception as e:  # a tile that does not compile or launch is a result, not a crash
                unfit = type(e).__name__ == "OutOfResources"  # more shared memory than the SM has: not a bug
                rec["unfit" if unfit else "error"] = f"{type(e).__name__}: {e}"[:300]
            recs.append(rec)
        for r in recs:
            if "us" in r:
                r["gbps"] = wbytes / r["us"] / 1e3
        out += recs
        print(json.dumps({"model": model, "op": op, "m": m, "best": best(recs), "cublas": recs[0].get("us"),
                          "engine": recs[1].get("us")}), flush=True)  # fmt: skip
    return out


def launch(name: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cfg: tg.GemvConfig, silu: bool,
           counters: torch.Tensor, pdl: bool) -> None:  # fmt: skip
    """One candidate's launch: `tma_*` through `tma_gemm` (no PDL there), the rest through the skinny GEMM."""
    if name.startswith("tma_"):
        tma_gemm(x, w, block_n=cfg.block_n, block_k=cfg.block_k, split_k=cfg.split_k, num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages, counters=counters, out=y)  # fmt: skip
    else:
        tg.skinny_gemm(x, w, silu=silu, counters=counters, config=cfg, out=y, pdl=pdl)


def best(recs: list[dict[str, Any]]) -> list:
    timed = [r for r in recs if "us" in r and r["variant"] != "cublas"]
    if not timed:
        return []
    r = min(timed, key=lambda r: r["us"])
    return [r["variant"], round(r["us"], 1)]


def rule_table(rows: list[dict[str, Any]], model: str, ops: list[str]) -> list[dict[str, Any]]:
    """Per M: the summed us of the model's projections under cuBLAS, the engine, each tile family (one config
    for every projection), and the best tile per projection."""
    out = []
    for m in sorted({r["m"] for r in rows if r["model"] == model and "us" in r}):
        at = [r for r in rows if r["model"] == model and r["m"] == m and "us" in r]
        if {r["op"] for r in at} != set(ops):
            continue
        fam: dict[str, dict[str, float]] = {}
        for r in at:
            key = r["variant"] if r["variant"] in ("cublas", "engine") else r["variant"].rsplit("_s", 1)[0]
            if "error" in r or r.get("err", 0) > 2e-2:
                continue
            fam.setdefault(key, {})
            fam[key][r["op"]] = min(fam[key].get(r["op"], 1e18), r["us"])
        sums = {key: sum(v.values()) for key, v in fam.items() if set(v) == set(ops)}
        per_op_best = sum(min(r["us"] for r in at if r["op"] == op and r["variant"] != "cublas") for op in ops)
        top = sorted((v, k) for k, v in sums.items() if k not in ("cublas", "engine"))[:3]
        out.append({"model": model, "m": m, "cublas": sums.get("cublas"), "engine": sums.get("engine"),
                    "best_per_op": per_op_best, "top_rules": [[k, round(v, 1)] for v, k in top]})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = kernel_args(__doc__, 200.0)
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="token counts M")
    p.add_argument("--no-tma", dest="tma", action="store_false", help="leave out the TMA kernel's tiles")
    setup = kernel_setup(p, argv)
    if setup is None:
        return 2
    args, (cuda, dev, dt) = setup
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 4
    shapes = {m: SHAPES[m] for m in args.models.split(",")} if cuda else SMOKE_SHAPES
    rows_m = tuple(int(v) for v in args.rows.split(",")) if cuda else SMOKE_ROWS
    tiles = TILES if cuda else SMOKE_TILES
    tma_tiles = (TMA_TILES if cuda else SMOKE_TMA_TILES) if args.tma else []
    deadline = time.perf_counter() + args.budget
    rows: list[dict[str, Any]] = []
    for model, ops in shapes.items():
        for op, n, k, silu in ops:
            rows += time_shape(model, op, n, k, silu, rows_m, dev, dt, sms, tiles, tma_tiles, deadline)
            if cuda:
                torch.cuda.empty_cache()
    rules = [t for model, ops in shapes.items() for t in rule_table(rows, model, [o[0] for o in ops])]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "wide_gemm.json").write_text(json.dumps({"rows": rows, "rules": rules}, indent=1))
    print("WIDE GEMM (us summed over the model's projections: cuBLAS, engine, best tile per projection, best rules)")
    for t in rules:
        f = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        print(f"  {t['model']:11s} M={t['m']:4d} cublas {f(t['cublas'])} engine {f(t['engine'])} "
              f"per-op best {f(t['best_per_op'])} rules {t['top_rules']}")  # fmt: skip
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
