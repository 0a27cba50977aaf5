"""Placement across GPU kinds and prices: which placement of a small/large pair serves its tokens cheapest at the
load it sustains within a TPOT SLO (`trsim tune --placements ... --gpu-prices ... --objective cost --slo-tpot-ms`,
run in-process for each cell).

    python studies/placement_cost/study.py --out studies/placement_cost/results/2026-12-02 --slo-tpot-ms 50

Cells: pair x hop rate; in each, every placement tuned with its own B (`sim.tune_layouts.tune_candidates`) at
N = 8, 16, 32, 64 upward, stopping at its first N where no B meets the SLO (as `trsim tune --objective cost` does),
and priced at its sustained N: its GPUs' USD per hour over its tok/s there (`sim.tune.choose` with no common N).
Beside it, the one-N ranking at N = 8 from the same points (what `--objective cost` compared before). Writes
summary.json and usd_per_mtok.png (USD per million output tokens against N, each placement's sustained N ringed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tokenrouter.calibration.gpus import load_gpu_prices
from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.core.names import TuneObjective
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.decide import Objective
from tokenrouter.sim.tune import Candidate, choose
from tokenrouter.sim.tune_layouts import (
    candidate_prices,
    candidate_specs,
    parse_placement,
    tune_candidates,
)

HERE = Path(__file__).parent
PAIRS = {"0.6b": ("qwen3-0.6b", "qwen3-32b"), "1.7b": ("qwen3-1.7b", "qwen3-32b")}
HOPS = [0.05, 0.1, 0.2]
NS = [8, 16, 32, 64]
ONE_N = 8  # the N the one-N rule compared at (the old default --compare-n)
PLACEMENTS = ["mps", "separate", "l4+h200", "l40s+h200", "h100+h100"]


def ranking(cands: list[Candidate], n: int | None) -> list[str]:
    """Labels best first by cost: at N = `n` for all, or (None) each at its sustained N; by repeated `choose`, so
    the order is the command's rule, ties and never-met candidates included."""
    left, out = list(cands), []
    while left:
        best = choose(left, n, TuneObjective.COST)
        out.append(best.label)
        left.remove(best)
    return out


def placement_row(c: Candidate) -> dict:
    at = c.sustained_n
    p = c.point(at if at is not None else c.first_n)
    return {
        "placement": c.label,
        "gpus": c.gpus,
        "usd_per_hour": c.usd_per_hour,
        "sustained_N": at,
        "B": list(p.best),
        "tok_s": round(c.throughput(p.concurrency), 1),
        "tpot_ms_p99": round(p.tpot_ms[1], 2),
        "usd_per_mtok": round(c.usd_per_mtok(p.concurrency), 4),
        "estimated": bool(c.estimated),
        "points": [point_row(c, q.concurrency) for q in c.points],
    }


def point_row(c: Candidate, n: int) -> dict:
    q = c.point(n)
    return {"N": n, "B": list(q.best), "tok_s": round(q.best_throughput, 1), "tpot_ms_p99": round(q.tpot_ms[1], 2),
            "meets_slo": q.meets_slo, "usd_per_mtok": round(c.usd_per_mtok(n), 4)}  # fmt: skip


def cell(args: tuple[str, float, float, str, list[int]]) -> dict:
    pair, hop, slo, prices_file, ns = args
    small, large = PAIRS[pair]
    t0 = time.monotonic()
    # as `trsim tune` starts: delayed, with no thresholds given (B is what it chooses)
    ov = DeploymentOverrides(small=small, large=large, hop_rate=hop, policy="delayed", thresholds=None)
    base = DeploymentFlags(None, ov).resolve()
    specs = candidate_specs([parse_placement(p) for p in PLACEMENTS], [None], base, 2)
    cands = tune_candidates(base, specs, ns, workload="low-effort", num_requests=0, top=1, seed=0, max_output=None,
                            usd=candidate_prices(base, specs, load_gpu_prices(prices_file)),
                            target=Objective(slo), stop_at_miss=True)  # fmt: skip
    return {
        "small": small,
        "large": large,
        "hop_rate": hop,
        "ranking_at_sustained_N": ranking(cands, None),
        f"ranking_at_N{ns[0]}": ranking(cands, ns[0]),
        "placements": [placement_row(c) for c in cands],
        "wall_s": round(time.monotonic() - t0, 1),
    }


def plot(cells: list[dict], slo: float, path: Path) -> None:
    pairs = sorted({c["small"] for c in cells})
    hops = sorted({c["hop_rate"] for c in cells})
    fig, axes = plt.subplots(len(pairs), len(hops), figsize=(4 * len(hops) + 1, 3.5 * len(pairs)), squeeze=False)
    for c in cells:
        ax = axes[pairs.index(c["small"])][hops.index(c["hop_rate"])]
        for k, r in enumerate(c["placements"]):
            pts = [(q["N"], q["usd_per_mtok"]) for q in r["points"]]
            line = ax.plot(*zip(*pts, strict=True), "o--" if r["estimated"] else "o-", ms=3,
                           label=r["placement"] + (" (est.)" if r["estimated"] else ""), color=f"C{k}")  # fmt: skip
            if r["sustained_N"] is not None:
                ax.plot([r["sustained_N"]], [r["usd_per_mtok"]], "o", ms=11, mfc="none", color=line[0].get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{c['small']} + 32B, hop {c['hop_rate']}", fontsize=9)
        ax.set_xlabel("N (closed-loop clients)")
        ax.set_ylabel("USD per million output tokens")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"USD/Mtok by N, each placement's sustained N ringed (TPOT p99 <= {slo:g} ms; dashed: ESTIMATED)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prices", default=str(HERE / "prices-2026-12-01.yaml"))
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0)
    ap.add_argument("--pairs", default=",".join(PAIRS), help="of " + ",".join(PAIRS))
    ap.add_argument("--hops", default=",".join(map(str, HOPS)))
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--workers", type=int, default=1, help="processes, one cell (pair, hop) each")
    a = ap.parse_args()
    ns = sorted(int(x) for x in a.ns.split(","))
    jobs = [(p, float(h), a.slo_tpot_ms, a.prices, ns) for p in a.pairs.split(",") for h in a.hops.split(",")]
    t0, load = time.monotonic(), os.getloadavg()[0]
    with ProcessPoolExecutor(a.workers) as pool:
        cells = list(pool.map(cell, jobs))
    a.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {load:.1f} at the start, "
        f"Python {platform.python_version()}",
        "wall_s": round(time.monotonic() - t0, 1),
        "slo_tpot_ms_p99": a.slo_tpot_ms,
        "ns": ns,
        "rule": "each placement swept upward over ns, stopping at its first N where no B meets the SLO; priced at "
        "the highest N before it (sustained_N); null: met at no N, ranked last",
        "prices_usd_per_gpu_hour": load_gpu_prices(a.prices),
        "prices_file": Path(a.prices).name,
        "workload": "low-effort",
        "num_requests": "decider default per trial: max(24, 3N); --top 1",
        "cells": cells,
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(cells, a.slo_tpot_ms, a.out / "usd_per_mtok.png")


if __name__ == "__main__":
    main()
