"""Cost of the simulator's hot path: pricing one step (`ModelCost.step_ms` of a split `StepStats`).

    python studies/sim_speed/bench_step_ms.py [--steps 100000]

A run of `trsim run` prices ~1e5 steps; this was a unit-test timing assertion (`test_step_ms_is_cheap`,
bound 2 s per 1e5 calls) and lives here so that tests assert behaviour only. It prints the time per call
and whether the old bound holds.
"""

from __future__ import annotations

import argparse
import platform
import time

from tokenrouter.calibration import CostModel, PartStats, StepStats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    args = p.parse_args()
    mc = CostModel("h200", "separate").for_model("qwen3-8b")
    t0 = time.perf_counter()
    for i in range(args.steps):
        mc.step_ms(StepStats(PartStats(8, 8, 0, 8000 + i), PartStats(1, 12, 12, 900)))
    dt = time.perf_counter() - t0
    print(
        f"{args.steps} calls in {dt:.3f} s ({dt / args.steps * 1e6:.2f} us/call) on {platform.machine()}, "
        f"{platform.python_version()}; bound 2 s per 1e5: {'ok' if dt * 1e5 / args.steps < 2.0 else 'EXCEEDED'}"
    )


if __name__ == "__main__":
    main()
