"""The decider against the simulator's own best: for each hop rate and N, every feasible B (or a fine grid at large
N) simulated as a trial, and `sim.decide.decide`'s pick beside the best of them.

    python studies/decider/sweep.py --hops 0.05,0.1,0.2 -n 1,2,4,8,16,32,64 -o studies/decider/results.csv

Each row: hop, N, the decider's B, its trial tok/s, the sweep's best B and tok/s, the gap, the B the decider
simulated, its seconds, and how many B the sweep covered. The sweep runs the decider's judging trial
(`sim.decide.run_trial` on `trial_config`) for every B, so the decider's pick is measured on the very run it was
chosen on, and the gap is the decider's alone. Every feasible B up to N = 16; above, a grid (`sweep_set`).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.core.policy import format_b
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.decide import decide, feasible, run_trial, trial_config
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.simulate import sim_config

FULL_UP_TO = 16  # every feasible B up to this N; above it, a grid


def sweep_set(n: int, near: tuple[int, ...]) -> list[tuple[int, int]]:
    """Every feasible (B_small, B_large) up to FULL_UP_TO; above, a grid: B_small in 1..6 (the best has held the small
    model for at most 5 at N <= 16), B_large every max(1, N // 16), every value within 3 of N * 3/4, and every B
    within 2 of the decider's pick `near` (so the pick is checked against its neighbours too)."""
    if n <= FULL_UP_TO:
        return [(a, b) for a in range(1, n + 1) for b in range(1, n + 1) if feasible((a, b), n)]
    step = max(1, n // 16)
    bs = set(range(1, n + 1, step)) | set(range(max(1, 3 * n // 4 - 3), min(n, 3 * n // 4 + 3) + 1))
    grid = {(a, b) for a in range(1, 7) for b in bs}
    grid |= {(near[0] + da, near[1] + db) for da in range(-2, 3) for db in range(-2, 3)}
    return sorted(b for b in grid if feasible(b, n))


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
                flags = DeploymentFlags(None, DeploymentOverrides(hop_rate=hop))
                cfg, _ = sim_config(flags.resolve(), flags.b_choice, concurrency=n)
                t0 = time.monotonic()
                choice = decide(cfg, n, pool=pool)
                secs = time.monotonic() - t0
                tcfg = trial_config(cfg, n)
                got = choice.best
                assert got is not None
                cands = sweep_set(n, got.thresholds)
                runs = list((pool.map if pool else map)(run_trial, [tcfg] * len(cands), cands))
                best = max(runs, key=lambda t: t.tok_s)
                mine = next(t for t in runs if t.thresholds == got.thresholds)  # the same run as the decider's
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
                row = {
                    "hop": hop,
                    "N": n,
                    "decider_B": format_b(got.thresholds),
                    "decider_tok_s": round(got.tok_s, 1),
                    "best_B": format_b(best.thresholds),
                    "best_tok_s": round(best.tok_s, 1),
                    "gap": round(mine.tok_s / best.tok_s - 1.0, 4),
                    "markov_B": format_b(choice.markov_best),
                    "scouted": len(choice.scouted),
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
