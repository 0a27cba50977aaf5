#!/usr/bin/env python
"""The decode-step switches of issue 30, A/B on one engine: step time, kernels, and greedy equality.

    python studies/engine/step_variants.py --out OUT_DIR                  # one H200: ~3-5 min
    python studies/engine/step_variants.py --out OUT_DIR --smoke          # tiny model, CPU (checks the script)

Switches (`EngineConfig` fields; toggled on one built engine, graphs recaptured in between):
- `gemv_preload`: each skinny-GEMM program loads its weight tiles into registers before the PDL wait;
- `decode_preload_kv`: decode attention loads the older keys of each split's first tile before the wait;
- `gemv_fold_norm`: residual add + RMSNorm ride in the qkv and gate|up projections (two launches fewer a layer);
- `argmax_chunk`: the greedy argmax by our chunked kernel, merged in the sampler (not torch's reduction).

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
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_profile as sp

OFF = {"gemv_preload": False, "decode_preload_kv": False, "gemv_fold_norm": False, "argmax_chunk": 0}
ALL = {"gemv_preload": True, "decode_preload_kv": True, "gemv_fold_norm": True, "argmax_chunk": 1024}
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("base", OFF),
    ("preload", {**OFF, "gemv_preload": True}),
    ("preload_kv", {**OFF, "gemv_preload": True, "decode_preload_kv": True}),
    ("fold", {**ALL, "argmax_chunk": 0}),
    ("all", ALL),
    ("argmax", {**OFF, "argmax_chunk": 1024}),
    ("base_again", OFF),
    ("all_again", ALL),
]
MODELS = {"qwen3-0.6b": (1, 8), "qwen3-32b": (8,)}


def apply(eng, sw: dict[str, Any]) -> None:
    """Set the switches on a built engine and recapture its graphs."""
    g = eng.model.gemv
    g.preload, g.fold_norm = sw["gemv_preload"], sw["gemv_fold_norm"]
    eng.config.decode_preload_kv = sw["decode_preload_kv"]
    eng.config.argmax_chunk = sw["argmax_chunk"]
    eng.recapture()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default="", help="comma list (default: all)")
    p.add_argument("--steps", type=int, default=32, help="greedy decode steps per comparison")
    p.add_argument("--budget", type=float, default=330.0, help="seconds; later models/variants are skipped")
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
    variants = [v for v in VARIANTS if not args.variants or v[0] in args.variants.split(",")]
    models = {"tiny-small": (1, 4)} if not cuda else {m: MODELS[m] for m in args.models.split(",")}
    for model, batches in models.items():
        if prof.elapsed() > args.budget:
            prof.out["errors"].append(f"{model}: skipped (time budget)")
            continue
        eng = None
        try:
            t = time.perf_counter()
            kw = {"ops_backend": "triton", "attention_backend": "triton"} if not cuda else {}
            eng = prof.engine(model, num_pages=8 * 80 + sp.WIDTH // 16 + 64 if cuda else 400,
                              max_context_len=sp.WIDTH if cuda else 256, graph_buckets=(1, 8), **kw)  # fmt: skip
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
                if model == "qwen3-32b" and name in ("fold", "argmax"):
                    continue  # no fold at hidden 5120; the argmax is the same kernel as on the 0.6B
                try:
                    apply(eng, sw)
                    rec: dict[str, Any] = {"model": model, "variant": name, **sw}
                    for b in batches:
                        greedy = sp.greedy_run(eng, prompts[:b], args.steps if cuda else 3)
                        if b not in ref:
                            ref[b] = greedy
                        c = sp.compare(ref[b], greedy)
                        rec[f"b{b}_rows_identical"] = c["rows_identical"]
                        rec[f"b{b}_first_divergence"] = c["first_divergence"]
                        rec[f"b{b}_logit_rel"] = c["first_step_logit_rel"]
                        m = prof.measure(eng, f"{model}_{name}_b{b}", b, 1024 if cuda else 30)
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
        for b in MODELS.get(r["model"], (1, 4)):
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
