"""The decider against the simulator's own best: for each hop rate and N, every feasible B (or a fine grid at large
N) simulated as a trial, and `sim.decide.decide`'s pick beside the best of them.

    python studies/decider/sweep.py --hops 0.05,0.1,0.2 -n 1,2,4,8,16,32,64 -o studies/decider/results.csv

Each row: hop, N, the decider's B, its trial tok/s, the sweep's best B and tok/s, the gap, trials the decider ran,
its seconds, and how many B the sweep covered. Trials of the sweep and of the decider are the same runs
(`sim.decide.run_trial` on `trial_config`), so the gap is the decider's alone.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.decide import decide, feasible, format_b, run_trial, trial_config
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.simulate import sim_config

FULL_UP_TO = 16  # every feasible B up to this N; above it, a grid


def sweep_set(n: int) -> list[tuple[int, int]]:
    """Every feasible (B_small, B_large) up to FULL_UP_TO; above, B_small in 1..8 and B_large on a grid of step
    max(1, N // 32) plus every value within 3 of N * 3/4 (where the best has always been)."""
    if n <= FULL_UP_TO:
        return [(a, b) for a in range(1, n + 1) for b in range(1, n + 1) if feasible((a, b), n)]
    step = max(1, n // 32)
    bs = set(range(1, n + 1, step)) | set(range(max(1, 3 * n // 4 - 3 * step), min(n, 3 * n // 4 + 3 * step) + 1))
    return [(a, b) for a in range(1, 9) for b in sorted(bs) if feasible((a, b), n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hops", default="0.05,0.1,0.2")
    ap.add_argument("-n", default="1,2,4,8,16,32,64")
    ap.add_argument("-o", type=Path, default=Path("studies/decider/results.csv"))
    ap.add_argument("-j", type=int, default=0)
    ap.add_argument("--all", type=Path, default=None, help="also write every swept B's trial here (CSV)")
    args = ap.parse_args()
    rows, every = [], []
    with sim_pool(args.j) as pool:
        for hop in [float(x) for x in args.hops.split(",")]:
            for n in [int(x) for x in args.n.split(",")]:
                cfg, _ = sim_config(DeploymentFlags(None, DeploymentOverrides(hop_rate=hop)), concurrency=n)
                t0 = time.monotonic()
                choice = decide(cfg, n, pool=pool)
                secs = time.monotonic() - t0
                tcfg = trial_config(cfg, n)
                cands = sweep_set(n)
                runs = list((pool.map if pool else map)(run_trial, [tcfg] * len(cands), cands))
                best = max(runs, key=lambda t: t.tok_s)
                every += [
                    {
                        "hop": hop,
                        "N": n,
                        "B": format_b(t.thresholds),
                        "tok_s": round(t.tok_s, 1),
                        "tpot_p99_ms": round(t.tpot_p99_ms, 3),
                    }
                    for t in runs
                ]
                got = choice.best
                assert got is not None
                row = {
                    "hop": hop,
                    "N": n,
                    "decider_B": format_b(got.thresholds),
                    "decider_tok_s": round(got.tok_s, 1),
                    "best_B": format_b(best.thresholds),
                    "best_tok_s": round(best.tok_s, 1),
                    "gap": round(got.tok_s / best.tok_s - 1.0, 4),
                    "markov_B": format_b(choice.markov_best),
                    "trials": len(choice.trials),
                    "decider_s": round(secs, 2),
                    "swept": len(cands),
                }
                rows.append(row)
                print(row, flush=True)
    for path, table in ((args.o, rows), (args.all, every)):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)


if __name__ == "__main__":
    main()
