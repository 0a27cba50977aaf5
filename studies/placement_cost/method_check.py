"""Check the estimated-profile method where it can be checked: estimate one measured model's pass tables from another
measured model's on the same H200 by weight bytes, KV bytes and FLOPs (`calibration.estimate.scale_table`, the split
an estimate for another GPU uses), and compare with the target model's measured points.

    python studies/placement_cost/method_check.py --out studies/placement_cost/results/DATE/method_check.json

Per (source, target) model pair and pass kind: the median and max relative error |estimate - measured| / measured
over the target's measured points (fit and held-out), beside two references: the target's own fit at the same
points (the floor the estimate cannot beat) and the naive estimate that scales the whole pass by the weight-bytes
ratio. CPU only, a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tokenrouter.calibration.estimate import Scale, anchor_rates, scale_table
from tokenrouter.calibration.measured import PassTable
from tokenrouter.calibration.passes import PassFn
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.models.spec import load_spec

KINDS = ("decode", "varlen", "eager")


def errors(fn: PassFn, measured: PassTable, factor: float = 1.0) -> dict[str, float]:
    errs = [abs(factor * fn(p.tokens, p.rows, p.context_tokens, p.extend_tokens) - p.ms) / p.ms
            for p in (*measured.points, *measured.held_out)]  # fmt: skip
    return {"median": statistics.median(errs), "max": max(errs), "points": len(errs)}


def check(profile_name: str = "h200") -> dict:
    prof = load_profile(profile_name)
    names = [n for n, m in prof.models.items() if m.passes is not None and m.tp == 1]
    rates = {n: anchor_rates(prof, n, prof.models[n]) for n in names}
    kv = {n: load_spec(n).kv_bytes_per_token for n in names}
    pairs = []
    for src in names:
        for dst in names:
            if src == dst:
                continue
            (w_s, f_s), (w_d, f_d) = rates[src], rates[dst]
            s = Scale(bandwidth=w_d / w_s, kv=kv[dst] / kv[src], flops=f_d / f_s)
            row = {"source": src, "target": dst, "scale": {"bandwidth": s.bandwidth, "kv": s.kv, "flops": s.flops}}
            for kind in KINDS:
                a, b = getattr(prof.models[src].passes, kind), getattr(prof.models[dst].passes, kind)
                if a is None or b is None:
                    continue
                row[kind] = {
                    "estimate": errors(PassFn.of(scale_table(a, w_s, f_s, s)), b),
                    "naive_bytes_ratio": errors(PassFn.of(a), b, w_d / w_s),
                    "own_fit": errors(PassFn.of(b), b),
                }
            pairs.append(row)
    summary = {}
    for kind in KINDS:
        got = [p for p in pairs if kind in p]
        worst = max(got, key=lambda p, k=kind: p[k]["estimate"]["max"])
        summary[kind] = {
            "median_of_medians": statistics.median(p[kind]["estimate"]["median"] for p in got),
            "naive_median_of_medians": statistics.median(p[kind]["naive_bytes_ratio"]["median"] for p in got),
            "worst_max": worst[kind]["estimate"]["max"],
            "worst_pair": f"{worst['source']} -> {worst['target']}",
        }
    return {"profile": profile_name, "created": prof.created, "models": names, "summary": summary, "pairs": pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args()
    res = check(args.profile)
    for p in res["pairs"]:
        cells = "  ".join(
            f"{k} {p[k]['estimate']['median']:6.1%}/{p[k]['estimate']['max']:6.1%} "
            f"(naive {p[k]['naive_bytes_ratio']['median']:6.1%}, own fit {p[k]['own_fit']['median']:5.1%})"
            for k in KINDS
            if k in p
        )
        print(f"{p['source']:>10} -> {p['target']:<10} {cells}")
    print(json.dumps(res["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
