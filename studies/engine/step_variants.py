#!/usr/bin/env python
"""The decode-step switches of issue 30, A/B on one engine: step time, kernels, and greedy equality.

    python studies/engine/step_variants.py --out OUT_DIR                  # one H200: ~3-5 min
    python studies/engine/step_variants.py --out OUT_DIR --smoke          # tiny model, CPU (checks the script)

Switches (`EngineConfig` fields; toggled on one built engine, graphs recaptured in between):
- `gemv_preload`: each skinny-GEMM program loads its weight tiles into registers before the PDL wait (inputs
  of one row: `GemvState.preload_max_rows`);
- `gemv_fold_norm`: residual add + RMSNorm ride in the qkv and gate|up projections (two launches fewer a layer;
  one row, hidden <= 4096);
- `gemv_lm_head`: the LM head of one-row graph steps through the skinny GEMM instead of cuBLAS;
- `argmax_chunk`: the greedy argmax by our chunked kernel, merged in the sampler (not torch's reduction);
- `small_m_table`: the measured skinny-GEMM tiles for 2-8 rows (`triton_gemv.SMALL_M_TABLE`);
- `norm_fold_rows`: the largest step (rows) whose norms fold into the projections (`GemvState.norm_fold_max_rows`);
- `late_norm_rows`: steps of `norm_fold_rows` + 1 .. this many rows fold the norms with the RMS applied after the
  product (`GemvState.late_norm_max_rows`, `gemv_late_norm_max_rows`; 0: off);
- `decode_splits`: decode attention's KV split count (`decode_num_splits`; None: the kernel chooses per batch);
- `split_programs`: the programs an SM the kernel's split choice aims at (`triton_decode.DECODE_PROGRAMS_PER_SM`);
- `short_config`: (num_warps, num_stages) of decode splits of at most 4 key tiles (`SHORT_DECODE_CONFIG`).

Per model (Qwen3-0.6B, then Qwen3-32B while the time budget lasts), per variant, in the order given (the
first variant is the reference; `base` and `all` are repeated at the end, so A/B/A/B shows the spread):
graph decode step at ctx 1k (engine.step back to back / waiting each result / the replay alone, ms),
torch.profiler kernels of the b=1 replay (count, busy/span), and greedy decoding of fixed random prompts
(b=1 and b=8, `--steps` steps) against the reference variant: rows with identical tokens, the step of first
divergence, the first decode step's max relative logit difference.

Writes OUT_DIR/step_variants.json, variants.csv, kernels_<model>_<variant>.csv; prints a summary last.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_profile as sp

from tokenrouter.engine.attention import triton_common, triton_decode

OFF = {"gemv_preload": False, "gemv_fold_norm": False, "gemv_lm_head": False, "argmax_chunk": 0, "small_m_table": False,
       "norm_fold_rows": 1, "late_norm_rows": 0, "decode_splits": None, "split_programs": 4,
       "short_config": (2, 1), "fused_rope": False}  # fmt: skip
DEFAULT = {"gemv_preload": True, "gemv_fold_norm": True, "gemv_lm_head": False, "argmax_chunk": 1024,
           "small_m_table": True, "norm_fold_rows": 1, "late_norm_rows": 0, "decode_splits": None, "split_programs": 4,
           "short_config": (2, 1), "fused_rope": False}  # fmt: skip
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("base", OFF),
    ("preload", {**OFF, "gemv_preload": True}),
    ("fold", {**OFF, "gemv_preload": True, "gemv_fold_norm": True}),
    ("default", DEFAULT),
    ("lm_head", {**DEFAULT, "gemv_lm_head": True}),
    ("base_again", OFF),
    ("default_again", DEFAULT),
    # the measured tiles for 2..8 rows (triton_gemv.SMALL_M_TABLE) off: the rule's tensor-core tiles, as before
    ("no_small_m", {**DEFAULT, "small_m_table": False}),
    ("no_small_m_again", {**DEFAULT, "small_m_table": False}),
    # the residual add + RMSNorm folded into the qkv and gate|up projections at up to 8 rows, not only at one
    # (slower at 2-8 rows on 2026-12-04, also with the RMS over the real rows only: its fold_rows.patch)
    ("fold_rows8", {**DEFAULT, "norm_fold_rows": 8}),
    ("fold_rows8_again", {**DEFAULT, "norm_fold_rows": 8}),
    # the same fold at 2-8 rows with the RMS applied after the product (no RMS pass before a program's first tile;
    # each program sums s^2 over its K slice): not HF's rounding, so greedy tokens may part from `default`
    ("late_norm8", {**DEFAULT, "late_norm_rows": 8}),
    ("late_norm8_again", {**DEFAULT, "late_norm_rows": 8}),
    # decode attention in 17 KV splits at every batch (the kernel's choice at width 8,256: 33 at b = 1, 9 at b = 8):
    # 64-key splits at 1k context for b = 8 too, twice the programs of its 128-key splits
    ("splits17", {**DEFAULT, "decode_splits": 17}),
    ("splits17_again", {**DEFAULT, "decode_splits": 17}),
    # fewer decode splits (17 were slower at b = 8 on 2026-12-04): the split choice aiming at 2 or 1 programs an SM,
    # b = 1 / 2 / 4 / 8 at width 8,256: 17 / 9 / 5 / 3 (1 an SM) and 33 / 17 / 9 / 5 (2) instead of 33 / 33 / 17 / 9
    ("programs2", {**DEFAULT, "split_programs": 2}),
    ("programs2_again", {**DEFAULT, "split_programs": 2}),
    ("programs1", {**DEFAULT, "split_programs": 1}),
    ("programs1_again", {**DEFAULT, "split_programs": 1}),
    # short decode splits (<= 4 key tiles) with 4 warps instead of 2
    ("short_w4", {**DEFAULT, "short_config": (4, 1)}),
    ("short_w4_again", {**DEFAULT, "short_config": (4, 1)}),
    # q/k norm + RoPE + KV write folded into decode attention (`EngineConfig.decode_fused_rope`): a launch a layer fewer
    ("fused_rope", {**DEFAULT, "fused_rope": True}),
    ("fused_rope_again", {**DEFAULT, "fused_rope": True}),
]
MODELS = {"qwen3-0.6b": (1, 8), "qwen3-32b": (1, 8)}
SMALL_M_TABLE = None  # the engine's measured table, saved before any variant empties it


def apply(eng, sw: dict[str, Any]) -> None:
    """Set the switches on a built engine and recapture its graphs."""
    g = eng.model.gemv
    g.preload, g.fold_norm, g.lm_head = sw["gemv_preload"], sw["gemv_fold_norm"], sw["gemv_lm_head"]
    g.ops.SMALL_M_TABLE = SMALL_M_TABLE if sw["small_m_table"] else {}  # read by gemv_config at capture
    g.norm_fold_max_rows = sw["norm_fold_rows"]
    g.late_norm_max_rows = sw["late_norm_rows"]
    eng.config.decode_num_splits = sw["decode_splits"]  # None: the kernel's own choice per batch
    # both read at each launch, so the recapture below takes them
    triton_decode.DECODE_PROGRAMS_PER_SM = sw["split_programs"]
    warps, stages = sw["short_config"]
    triton_common.SHORT_DECODE_CONFIG = triton_common.KernelConfig(block_n=64, num_warps=warps, num_stages=stages)
    eng.config.argmax_chunk = sw["argmax_chunk"]
    eng.config.decode_fused_rope = sw["fused_rope"]  # read when each step's attention metadata is built
    eng.recapture()


ROW_CASES = [(1, 10), (4, 10), (8, 10), (8, 16), (16, 10), (24, 10)]  # (rows, tokens a row) of a large model's steps


def parse_row_cases(text: str) -> list[tuple[int, int]]:
    """`"1x10,2x10"` -> [(1, 10), (2, 10)]: (rows, tokens a row) of the rows study."""
    out = []
    for item in text.split(","):
        rows, sep, tokens = item.strip().partition("x")
        if not sep or not rows.isdigit() or not tokens.isdigit() or int(rows) < 1 or int(tokens) < 1:
            raise SystemExit(f"--rows-cases: {item!r} is not ROWSxTOKENS (e.g. 2x10)")
        out.append((int(rows), int(tokens)))
    return out


def profile_step(prof: sp.Profiler, eng, bat, label: str) -> dict[str, dict[str, float]]:
    """torch.profiler over one step of `bat` (after two unprofiled ones): its GPU kernels in launch order, written
    as kernels_<label>.csv, and their count and busy us per class (`step_profile.classify`)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        eng.step(bat).result()
    prof.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        eng.step(bat).result()
        prof.sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        tp.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0))} for e in events
                      if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda k: k["ts"])  # fmt: skip
    t0 = kernels[0]["ts"] if kernels else 0.0
    for k in kernels:
        k["off"] = k["ts"] - t0
    res = sp.classify(kernels, eng.spec.num_layers)
    prof.write_kernels(label, kernels)
    return {"span_us": res["span_us"], "busy_us": res["busy_us"], "kernels": res["kernels"],
            **{c: v for c, v in res["classes"].items() if v["count"]}}  # fmt: skip


def row_cases(prof: sp.Profiler, eng, args: argparse.Namespace, cases: list[tuple[int, int]], ctx: int,
              what: str) -> Iterator[tuple[int, int, Any]]:  # fmt: skip
    """(rows, tokens a row, batch) per case while the time budget lasts: `rows` fresh requests at context `ctx`,
    each feeding its last `tokens` tokens; their pages are released when the caller moves on (or closes this
    generator: callers use `contextlib.closing`, so an error releases them before the engine closes)."""
    import engine_bench as eb

    from tokenrouter.core.batch import Batch, BatchRow

    for b, t in cases:
        if prof.elapsed() > args.budget:
            prof.out["errors"].append(f"rows {b}x{t}{what}: skipped (time budget)")
            continue
        reqs = eb.make_requests(eng, b, ctx)
        try:
            yield b, t, Batch(0, 0, [BatchRow(r, ctx - t, t) for r in reqs])
        finally:
            eb.release(eng, reqs)


def time_steps(prof: sp.Profiler, eng, bat) -> float:
    """ms per step of `bat`, each result waited (3 warm-up steps, then 20 timed; one of each on CPU)."""
    for _ in range(3 if prof.cuda else 1):
        eng.step(bat).result()
    prof.sync()
    n = 20 if prof.cuda else 1
    t0 = time.perf_counter()
    for _ in range(n):
        eng.step(bat).result()
    prof.sync()
    return (time.perf_counter() - t0) / n * 1e3


def rows_wide_gemv(prof: sp.Profiler, eng, args: argparse.Namespace, out: list[dict[str, Any]], model: str,
                   ctx: int) -> None:  # fmt: skip
    """The rows study's varlen path again with its passes of up to `args.rows_gemv` tokens through the skinny GEMM's
    tensor-core tiles (`gemv_varlen_max_rows`; one recapture): `limit8_gemv_ms` (and kernels) per case. Fresh
    requests (the context KV is uninitialized memory), so no logit comparison: the tests check the values."""
    eng.config.graph_max_row_tokens = 8
    eng._rules.clear()
    eng.model.gemv.varlen_max_rows = args.rows_gemv
    eng.recapture()
    recs = {(r["rows"], r["tokens"]): r for r in out}
    try:
        with contextlib.closing(row_cases(prof, eng, args, list(recs), ctx, " gemv")) as cases:
            for b, t, bat in cases:
                rec = recs[b, t]
                rec["limit8_gemv_ms"] = time_steps(prof, eng, bat)
                if prof.cuda and args.rows_profile:
                    rec["limit8_gemv_classes"] = profile_step(prof, eng, bat, f"{model}_rows{b}x{t}_limit8_gemv")
                prof.log(f"rows {b}x{t} gemv: {rec['limit8_gemv_ms']:.3f} ms (cuBLAS {rec['limit8_ms']:.3f})")
    finally:
        eng.model.gemv.varlen_max_rows = 0


def rows_extend_ab(prof: sp.Profiler, eng, args: argparse.Namespace, out: list[dict[str, Any]], ctx: int,
                   field: str, values: tuple[Any, Any], keys: tuple[str, str]) -> None:  # fmt: skip
    """The rows study's varlen path with `EngineConfig.<field>` at values[0] and values[1], A/B/A/B (a recapture
    each): lists of ms per case under `keys[0]` / `keys[1]`; the field goes back to values[0] at the end."""
    eng.config.graph_max_row_tokens = 8
    eng._rules.clear()
    recs = {(r["rows"], r["tokens"]): r for r in out}
    try:
        for i in (0, 1, 0, 1):
            setattr(eng.config, field, values[i])
            eng.recapture()
            with contextlib.closing(row_cases(prof, eng, args, list(recs), ctx, f" {keys[i]}")) as cases:
                for b, t, bat in cases:
                    ms = time_steps(prof, eng, bat)
                    recs[b, t].setdefault(keys[i], []).append(ms)
                    prof.log(f"rows {b}x{t} {keys[i]}: {ms:.3f} ms")
    finally:
        setattr(eng.config, field, values[0])


def rows_study(prof: sp.Profiler, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A large model's steps whose rows carry 9-16 tokens (the small model's run since its last visit): in the
    decode graphs (every token a virtual decode row; graph_max_row_tokens 16) against the varlen path (the
    default limit 8 sends them there: a varlen graph, or eager where padding would cost more). One engine, the
    rule switched between the two; ms per step (result waited each step) and the logits of the two paths."""
    cuda = prof.cuda
    model, ctx = (args.rows_model, args.rows_ctx) if cuda else ("tiny-small", 40)
    kw = {} if cuda else {"ops_backend": "triton", "attention_backend": "triton"}
    cases_wanted = parse_row_cases(args.rows_cases) if args.rows_cases else ROW_CASES
    pages = max(b for b, _ in cases_wanted) * -(-ctx // 16) + sp.WIDTH // 16 + 64 if cuda else 400
    # varlen graphs on (the profiler's engines leave them off) up to 256 tokens, cuBLAS there (`--rows-gemv` compares)
    eng = prof.engine(model, num_pages=max(pages, 16 * 80 + sp.WIDTH // 16 + 64), graph_max_row_tokens=16,
                      max_context_len=sp.WIDTH if cuda else 256, max_num_batched_tokens=256,
                      varlen_graphs=args.rows_varlen, gemv_varlen_max_rows=0, **kw)  # fmt: skip
    out: list[dict[str, Any]] = []
    try:
        with contextlib.closing(row_cases(prof, eng, args, cases_wanted if cuda else [(2, 10)], ctx, "")) as cases:
            for b, t, bat in cases:
                rec: dict[str, Any] = {"model": model, "rows": b, "tokens": t}
                logits = {}
                for limit in (8, 16):
                    eng.config.graph_max_row_tokens = limit
                    eng._rules.clear()
                    rec[f"limit{limit}_path"] = "graph" if eng.graph_bucket_for(bat) is not None else "varlen"
                    rec[f"limit{limit}_ms"] = time_steps(prof, eng, bat)
                    if cuda and args.rows_profile and limit == 8:
                        rec["limit8_classes"] = profile_step(prof, eng, bat, f"{model}_rows{b}x{t}_limit8")
                    h = eng.step(bat, return_logits=True)
                    logits[limit] = h.result().logits.float()
                    rec[f"limit{limit}_varlen_bucket"] = getattr(h, "varlen_bucket", None)
                la, lb = logits[8], logits[16]
                rec["logit_rel"] = float((la - lb).abs().max() / lb.abs().max())
                rec["argmax_equal"] = bool((la.argmax(-1) == lb.argmax(-1)).all())
                out.append(rec)
                prof.log(f"rows {b}x{t}: " + json.dumps(rec))
        if args.rows_gemv and eng.model.gemv is not None:
            rows_wide_gemv(prof, eng, args, out, model, ctx)
        if args.rows_fused_extend:
            rows_extend_ab(prof, eng, args, out, ctx, "extend_fused_reduce", (False, True),
                           ("reduce_ext_ms", "fused_ext_ms"))  # fmt: skip
        eng.config.extend_split_programs = args.rows_split_programs  # the dynamic sides' program cap
        if args.rows_split_keys:
            rows_extend_ab(prof, eng, args, out, ctx, "extend_split_keys", (0, args.rows_split_keys),
                           ("shape_splits_ms", "dyn_splits_ms"))  # fmt: skip
        if args.rows_short_block_m:  # both sides with --rows-split-keys' dynamic splits (0: the shape rule)
            eng.config.extend_split_keys = args.rows_split_keys
            try:
                rows_extend_ab(prof, eng, args, out, ctx, "extend_short_block_m", (0, args.rows_short_block_m),
                               ("short_tile_default_ms", "short_tile_ms"))  # fmt: skip
            finally:
                eng.config.extend_split_keys = 0
    finally:
        eng.config.graph_max_row_tokens = 16
        eng.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default="", help="comma list (default: all)")
    p.add_argument("--steps", type=int, default=32, help="greedy decode steps per comparison")
    p.add_argument("--budget", type=float, default=330.0, help="seconds; later models/variants are skipped")
    p.add_argument("--ctx", type=int, default=1024, help="context tokens of every row in the timed steps (GPU)")
    p.add_argument("--width", type=int, default=sp.WIDTH, help="block-table width, tokens (GPU; fixes decode splits)")
    p.add_argument("--batches", default="", help="batch sizes on the GPU (default 1,8; graphs captured for each)")
    p.add_argument("--rows", action="store_true", help="only the large model's 9-16 token rows (rows_study)")
    p.add_argument("--rows-gemv", type=int, default=0,
                   help="rows study: then varlen passes of up to N tokens via the skinny GEMM (0: not)")  # fmt: skip
    p.add_argument("--rows-fused-extend", action="store_true",
                   help="rows study: then the varlen passes with extend_fused_reduce off/on, A/B/A/B")  # fmt: skip
    p.add_argument("--rows-split-keys", type=int, default=0,
                   help="rows study: the varlen passes with extend_split_keys 0 / N, A/B/A/B (0: off)")  # fmt: skip
    p.add_argument("--rows-split-programs", type=int, default=0,
                   help="rows study: extend_split_programs on the dynamic-split sides (0: no cap)")  # fmt: skip
    p.add_argument("--rows-short-block-m", type=int, default=0,
                   help="rows study: the varlen passes with extend_short_block_m 0 / M, A/B/A/B, both with "
                   "--rows-split-keys (0: off)")  # fmt: skip
    p.add_argument("--rows-ctx", type=int, default=1024, help="rows study: context tokens of every row (GPU)")
    p.add_argument("--rows-model", default="qwen3-32b", help="rows study: the model (GPU)")
    p.add_argument("--rows-cases", default="",
                   help="rows study: ROWSxTOKENS cases on the GPU, e.g. 1x10,2x10 (default: ROW_CASES)")  # fmt: skip
    p.add_argument("--rows-profile", action="store_true",
                   help="rows study: also the kernels of one limit-8 (varlen) step per case, by class")  # fmt: skip
    p.add_argument("--rows-eager", dest="rows_varlen", action="store_false",
                   help="rows study without varlen graphs (the limit-8 path runs eagerly)")  # fmt: skip
    args = p.parse_args(argv)
    args.cases, args.tmp = "", ""
    prof = sp.Profiler(args)
    cuda = prof.cuda
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    res: dict[str, Any] = {"env": prof.out["env"], "errors": prof.out["errors"], "rows": rows}
    if cuda:
        prof.bench.copy_bandwidth()
        prof.copy_gbps = res["copy_gbps"] = prof.bench.copy_gbps
    if args.rows:
        res["rows_study"] = rows = rows_study(prof, args)
        (out / "step_variants.json").write_text(json.dumps(res, indent=1, default=str))
        print("ROWS (ms per step, result waited; limit 8: the default rule, limit 16: rows in the decode graphs)")
        for r in rows:
            for key, what in (("limit8_classes", "limit-8"), ("limit8_gemv_classes", "limit-8 skinny")):
                if key in r:
                    cl = r[key]
                    print(f"  {r['rows']:2d} x {r['tokens']:2d} {what} kernels: span {cl['span_us'] / 1e3:.2f} ms, "
                          + " ".join(f"{c} {v['count']}:{v['us'] / 1e3:.2f}" for c, v in cl.items()
                                     if isinstance(v, dict)))  # fmt: skip
            for a, b, what in (
                ("reduce_ext_ms", "fused_ext_ms", "extend merge: reduce kernel / in-kernel"),
                ("shape_splits_ms", "dyn_splits_ms", "short-group splits: shape rule / dynamic"),
                ("short_tile_default_ms", "short_tile_ms", "short-group tile: 64 rows / --rows-short-block-m"),
            ):
                if b in r:
                    print(f"  {r['rows']:2d} x {r['tokens']:2d} {what}: " + " / ".join(f"{x:.3f}" for x in r[a])
                          + " ms vs " + " / ".join(f"{x:.3f}" for x in r[b]) + " ms")  # fmt: skip
            if "limit8_gemv_ms" in r:
                print(f"  {r['rows']:2d} x {r['tokens']:2d} varlen: cuBLAS {r['limit8_ms']:.3f} ms, "
                      f"skinny GEMM {r['limit8_gemv_ms']:.3f} ms")  # fmt: skip
            print(f"  {r['model']} {r['rows']:2d} x {r['tokens']:2d}: limit 8 {r['limit8_ms']:.3f} "
                  f"({r['limit8_path']}, varlen bucket {r['limit8_varlen_bucket']}) "
                  f"limit 16 {r['limit16_ms']:.3f} ({r['limit16_path']}) logits rel {r['logit_rel']:.1e} "
                  f"argmax equal {r['argmax_equal']}")  # fmt: skip
        for e in res["errors"]:
            print("ERROR", e)
        return 0
    global SMALL_M_TABLE
    from tokenrouter.engine import triton_gemv

    SMALL_M_TABLE = triton_gemv.SMALL_M_TABLE
    named = dict(VARIANTS)
    # in the order given (the first is the reference of the greedy comparison)
    variants = [(n, named[n]) for n in args.variants.split(",")] if args.variants else VARIANTS
    batches_arg = tuple(int(b) for b in args.batches.split(",")) if args.batches else None
    models = {"tiny-small": (1, 4)} if not cuda else {m: batches_arg or MODELS[m] for m in args.models.split(",")}
    for model, batches in models.items():
        if prof.elapsed() > args.budget:
            prof.out["errors"].append(f"{model}: skipped (time budget)")
            continue
        eng = None
        try:
            t = time.perf_counter()
            kw = {"ops_backend": "triton", "attention_backend": "triton"} if not cuda else {}
            # the greedy comparisons' 8 rows of up to ~1.3k tokens, or the timed steps' rows at --ctx if more
            pages = max(8 * 80, max(batches) * -(-(args.ctx + 64) // 16)) + args.width // 16 + 64
            eng = prof.engine(model, num_pages=pages if cuda else 400,
                              max_context_len=args.width if cuda else 256,
                              graph_buckets=tuple(sorted({1, 8, *batches})), **kw)  # fmt: skip
            prof.log(f"{model}: built in {time.perf_counter() - t:.1f}s")
            g = torch.Generator().manual_seed(5)
            lo, hi = (100, 900) if cuda else (5, 40)
            prompts = [torch.randint(0, eng.spec.vocab_size, (int(n),), generator=g).tolist()
                       for n in torch.randint(lo, hi, (8,), generator=g)]  # fmt: skip
            ref: dict[int, Any] = {}
            for name, sw in variants:
                if prof.elapsed() > args.budget:
                    prof.out["errors"].append(f"{model} {name}: skipped (time budget)")
                    continue
                if model == "qwen3-32b" and name in ("fold", "lm_head"):
                    continue  # no fold at hidden 5120; the LM head switch is for small models
                try:
                    apply(eng, sw)
                    rec: dict[str, Any] = {"model": model, "variant": name, "batches": batches, **sw}
                    for b in batches:
                        greedy = sp.greedy_run(eng, prompts[:b], args.steps if cuda else 3)
                        if b not in ref:
                            ref[b] = greedy
                        c = sp.compare(ref[b], greedy)
                        rec[f"b{b}_rows_identical"] = c["rows_identical"]
                        rec[f"b{b}_first_divergence"] = c["first_divergence"]
                        rec[f"b{b}_logit_rel"] = c["first_step_logit_rel"]
                        m = prof.measure(eng, f"{model}_{name}_b{b}", b, args.ctx if cuda else 30)
                        for k in ("step_ms", "step_wait_ms", "replay_ms", "floor_ms", "kernels", "busy_us", "span_us"):
                            if k in m:
                                rec[f"b{b}_{k}"] = m[k]
                    rows.append(rec)
                    prof.log(f"{model} {name}: " + " ".join(
                        f"b{b} {rec.get(f'b{b}_step_ms', 0):.3f}/{rec.get(f'b{b}_replay_ms', 0):.3f} ms "
                        f"k{rec.get(f'b{b}_kernels', '-')} same {rec[f'b{b}_rows_identical']}/{b} "
                        f"rel {rec[f'b{b}_logit_rel']:.1e}" for b in batches))  # fmt: skip
                except Exception as e:
                    prof.error(f"{model} {name}", e)
        except Exception as e:
            prof.error(model, e)
        finally:
            if eng is not None:
                eng.close()
            del eng
            prof.free()
    (out / "step_variants.json").write_text(json.dumps(res, indent=1, default=str))
    if rows:
        cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], list)))
        with open(out / "variants.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    print(f"STEP VARIANTS {res['env'].get('gpu', '')} copy {res.get('copy_gbps', 0):.0f} GB/s "
          "(ms: step back to back / replay; kernels; greedy rows identical to the first variant)")  # fmt: skip
    for r in rows:
        parts = []
        for b in r.get("batches", MODELS.get(r["model"], (1, 4))):
            if f"b{b}_step_ms" in r:
                parts.append(f"b{b} {r[f'b{b}_step_ms']:.3f}/{r.get(f'b{b}_replay_ms', 0):.3f} "
                             f"k{r.get(f'b{b}_kernels', '-')} same {r[f'b{b}_rows_identical']}/{b} "
                             f"rel {r[f'b{b}_logit_rel']:.1e}")  # fmt: skip
        print(f"  {r['model']:11s} {r['variant']:11s} " + " | ".join(parts))
    for e in res["errors"]:
        print("ERROR", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
