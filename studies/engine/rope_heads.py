#!/usr/bin/env python
"""q/k-norm + RoPE + KV store with several heads a program, against one head a program (issue 30).

    python studies/engine/rope_heads.py --out OUT_DIR          # one H200: ~3 min
    python studies/engine/rope_heads.py --out OUT_DIR --smoke  # CPU (TRITON_INTERPRET=1): checks the script

`qk_norm_rope_store` launched one one-warp program per (token, head): 72 programs a token for Qwen3-32B, so a
varlen pass of 256 tokens launched 18,432 programs of 64 elements each, and the kernel grew linearly with the tokens
(2.6 us at 16 tokens, 22.9 us at 256 on the H200). `triton_ops.rope_heads_per_program` now lets up to 16 heads share
a program once the grid would pass `ROPE_MAX_PROGRAMS`.

1. Kernel: per model (q + kv heads) and token count, the kernel at 1, 2, 4, 8, 16 heads a program in CUDA graphs
   (us), every output (q, K cache, V cache) compared bitwise with one head a program.
2. Passes (GPU): Qwen3-32B varlen-graph steps of rows x 10 tokens at 1k context with the old grid
   (`ROPE_MAX_PROGRAMS` huge: one head a program everywhere) and with the rule, A/B/A/B on one engine (graphs
   recaptured), ms per step, and the two paths' logits compared.

Writes OUT_DIR/rope_heads.json and prints a summary last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_device import kernel_args, kernel_setup

HEADS = {"qwen3-0.6b": (16, 8), "qwen3-32b": (64, 8)}
TOKENS = (1, 8, 16, 48, 96, 192, 256, 512, 1024, 2048)
SMOKE_HEADS = {"tiny": (4, 2)}
SMOKE_TOKENS = (3, 40)
PASS_CASES = ((8, 10), (24, 10), (48, 10))  # rows x tokens: buckets 96, 256, 512
HP = (1, 2, 4, 8, 16)
OLD_GRID = 1 << 40  # ROPE_MAX_PROGRAMS that keeps one head a program at any size


def kernel_case(tops, hq: int, hkv: int, t: int, dev: torch.device, dt: torch.dtype) -> dict[str, Any]:
    from tokenrouter.engine.layers import RotaryEmbedding

    d, page = 128 if dev.type == "cuda" else 16, 16
    g = torch.Generator(device=dev).manual_seed(t)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=dev, generator=g).to(dt)
    rope = RotaryEmbedding(d, 1e6, 4096, device=dev)
    pos = torch.randint(0, 4096, (t,), device=dev, generator=g, dtype=torch.int32)
    pages = t // page + 2
    slots = torch.randperm(pages * page, device=dev, generator=g)[:t].to(torch.int64)
    nw = (1 + 0.1 * torch.randn(2, d, device=dev, generator=g)).to(dt)
    rule = tops.rope_heads_per_program(t, hq + hkv)
    rec: dict[str, Any] = {"q_heads": hq, "kv_heads": hkv, "tokens": t, "rule": rule}
    outs = {}
    for hp in HP:
        kc, vc = torch.zeros(2, pages, page, hkv, d, device=dev, dtype=dt)
        q = tops.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc, vc, slots, hq, hkv, d, heads_per_program=hp)
        outs[hp] = (q, kc, vc)
        same = all(torch.equal(a, b) for a, b in zip(outs[1], outs[hp], strict=True))
        rec[f"hp{hp}_identical"] = same
        if dev.type == "cuda":
            import graph_timing as gt

            def run(hp: int = hp, kc: torch.Tensor = kc, vc: torch.Tensor = vc) -> None:
                tops.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc, vc, slots, hq, hkv, d,
                                        heads_per_program=hp)  # fmt: skip

            rec[f"hp{hp}_us"] = gt.capture_and_time(run, n=20, per=1).median_us
    return rec


def pass_study(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Part 2: whole 32B varlen passes, old grid against the rule, A/B/A/B on one engine."""
    import step_profile as sp
    import step_variants as sv

    from tokenrouter.engine import triton_ops

    prof = sp.Profiler(argparse.Namespace(smoke=False, budget=args.budget))
    eng = prof.engine("qwen3-32b", num_pages=48 * 66 + sp.WIDTH // 16 + 64, max_context_len=sp.WIDTH,
                      max_num_batched_tokens=512, varlen_graphs=True)  # fmt: skip
    default = triton_ops.ROPE_MAX_PROGRAMS
    try:
        with contextlib.closing(sv.row_cases(prof, eng, args, list(PASS_CASES), 1024, "")) as cases:
            for b, t, bat in cases:
                rec: dict[str, Any] = {"rows": b, "tokens": t}
                logits = {}
                for label, limit in (("old", OLD_GRID), ("rule", default), ("old_again", OLD_GRID),
                                     ("rule_again", default)):  # fmt: skip
                    triton_ops.ROPE_MAX_PROGRAMS = limit  # read at each launch: the recapture takes it
                    eng.recapture()
                    rec[f"{label}_ms"] = sv.time_steps(prof, eng, bat)
                    h = eng.step(bat, return_logits=True)
                    logits[label] = h.result().logits.float()
                    rec["bucket"] = getattr(h, "varlen_bucket", None)
                rec["logits_identical"] = bool(torch.equal(logits["old"], logits["rule"]))
                rec["logit_rel"] = float((logits["old"] - logits["rule"]).abs().max() / logits["old"].abs().max())
                out["passes"].append(rec)
                prof.log("pass " + json.dumps(rec))
    finally:
        triton_ops.ROPE_MAX_PROGRAMS = default
        eng.close()


def main(argv: list[str] | None = None) -> int:
    p = kernel_args(__doc__, 240.0)  # --budget: seconds for the pass study's cases
    p.add_argument("--no-passes", dest="passes", action="store_false", help="kernel part only")
    setup = kernel_setup(p, argv)
    if setup is None:
        return 2
    args, (cuda, dev, dt) = setup
    if not cuda:
        from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

        patch_interpreter_for_numpy24()
    from tokenrouter.engine import triton_ops as tops

    out: dict[str, Any] = {"kernel": [], "passes": [], "errors": []}
    t0 = time.perf_counter()
    for model, (hq, hkv) in (HEADS if cuda else SMOKE_HEADS).items():
        for t in TOKENS if cuda else SMOKE_TOKENS:
            rec = {"model": model, **kernel_case(tops, hq, hkv, t, dev, dt)}
            out["kernel"].append(rec)
            print(json.dumps(rec), flush=True)
    if cuda and args.passes:
        try:
            pass_study(args, out)
        except Exception as e:  # the kernel part's results still get written
            out["errors"].append(f"passes: {type(e).__name__}: {e}"[:300])
    out["seconds"] = time.perf_counter() - t0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "rope_heads.json").write_text(json.dumps(out, indent=1))
    print("ROPE HEADS (us at 1 / 2 / 4 / 8 / 16 heads a program; rule's choice; all outputs identical to 1)")
    for r in out["kernel"]:
        us = " / ".join(f"{r[f'hp{hp}_us']:.1f}" for hp in HP) if cuda else "-"
        same = all(r[f"hp{hp}_identical"] for hp in HP)
        print(f"  {r['model']:11s} T={r['tokens']:5d} {us}  rule {r['rule']:2d}  identical {same}")
    for r in out["passes"]:
        print(
            f"  32B {r['rows']}x{r['tokens']} bucket {r['bucket']}: old {r['old_ms']:.3f} / {r['old_again_ms']:.3f}"
            f" rule {r['rule_ms']:.3f} / {r['rule_again_ms']:.3f} ms, logits identical {r['logits_identical']}"
        )
    for e in out["errors"]:
        print("  ERROR", e)
    bad = [r for r in out["kernel"] if not all(r[f"hp{hp}_identical"] for hp in HP)] + out["errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
