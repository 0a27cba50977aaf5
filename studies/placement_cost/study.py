"""Placement across GPU kinds and prices: which placement of a small/large pair serves most tokens per second, and
which serves them cheapest (`trsim tune --placements ... --gpu-prices ...`, run in-process for each cell).

    python studies/placement_cost/study.py --out studies/placement_cost/results/2026-12-01

Cells: pair x hop rate x N; in each, every placement tuned with its own B (`sim.tune_layouts`), its throughput
at that B and its USD per million output tokens at the price file's prices. Writes summary.json and the plots.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tokenrouter.calibration.gpus import load_gpu_prices
from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.tune_layouts import (
    candidate_prices,
    candidate_specs,
    parse_placement,
    tune_candidates,
    tuning_flags,
)

HERE = Path(__file__).parent
PAIRS = [("qwen3-0.6b", "qwen3-32b"), ("qwen3-1.7b", "qwen3-32b")]
HOPS = [0.05, 0.1, 0.2]
NS = [8, 64]
PLACEMENTS = ["mps", "separate", "l4+h200", "l40s+h200", "h100+h100"]


def cell(args: tuple[str, str, float, int, int, str]) -> list[dict]:
    small, large, hop, n, requests, prices_file = args
    prices = load_gpu_prices(prices_file)
    flags = tuning_flags(DeploymentFlags(None, DeploymentOverrides(small=small, large=large, hop_rate=hop)))
    specs = candidate_specs([parse_placement(p) for p in PLACEMENTS], [None], flags.resolve(), 2)
    cands = tune_candidates(flags, specs, [n], workload="low-effort", num_requests=requests, top=1, seed=0,
                            max_output=None, usd=candidate_prices(flags, specs, prices))  # fmt: skip
    return [
        {
            "small": small,
            "large": large,
            "hop_rate": hop,
            "N": n,
            "placement": c.label,
            "gpus": c.gpus,
            "B": list(c.point(n).best),
            "tok_s": round(c.throughput(n), 1),
            "tok_s_per_gpu": round(c.per_gpu(n), 1),
            "tpot_ms_p50": round(c.point(n).tpot_ms[0], 2),
            "tpot_ms_p99": round(c.point(n).tpot_ms[1], 2),
            "usd_per_hour": c.usd_per_hour,
            "usd_per_mtok": round(c.usd_per_mtok(n), 4),
            "estimated": bool(c.estimated),
            "estimated_notes": c.estimated,
        }
        for c in cands
    ]


def plot(rows: list[dict], key: str, label: str, path: Path) -> None:
    fig, axes = plt.subplots(len(PAIRS), len(NS), figsize=(10, 7), sharex=True)
    for i, (small, _) in enumerate(PAIRS):
        for j, n in enumerate(NS):
            ax = axes[i][j]
            for p in PLACEMENTS:
                pts = [(r["hop_rate"], r[key]) for r in rows if r["small"] == small and r["N"] == n
                       and r["placement"] == p]  # fmt: skip
                est = any(r["estimated"] for r in rows if r["placement"] == p)
                ax.plot(*zip(*sorted(pts), strict=True), "o--" if est else "o-", label=p + (" (est.)" if est else ""))
            ax.set_title(f"{small} + 32B, N = {n}", fontsize=9)
            ax.set_xlabel("hop rate")
            ax.set_ylabel(label)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{label} by placement (dashed: rests on an ESTIMATED profile)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prices", default=str(HERE / "prices-2026-12-01.yaml"))
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    jobs = [(s, lg, hop, n, 32 if n == 8 else 128, a.prices) for s, lg in PAIRS for hop in HOPS for n in NS]
    with ProcessPoolExecutor(a.workers) as pool:
        rows = [r for cell_rows in pool.map(cell, jobs) for r in cell_rows]
    a.out.mkdir(parents=True, exist_ok=True)
    summary = {"prices_usd_per_gpu_hour": load_gpu_prices(a.prices), "prices_file": Path(a.prices).name,
               "workload": "low-effort", "num_requests": {"8": 32, "64": 128}, "cells": rows}  # fmt: skip
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rows, "tok_s", "tok/s", a.out / "tok_s.png")
    plot(rows, "usd_per_mtok", "USD per million output tokens", a.out / "usd_per_mtok.png")


if __name__ == "__main__":
    main()
