"""KV pressure: steady throughput against the number of clients N when both models get 1 GB of KV.

    python studies/kv_pressure/run_kv_pressure.py --out studies/kv_pressure/kv_pressure.csv

Qwen3-0.6B + Qwen3-32B under MPS, R2R at hop rate 0.1, eager, low-effort workload (128 requests, closed loop),
`kv_budget_gb: 1.0` per model (8,719 tokens on the 0.6B, 3,814 on the 32B), with admission on (the default:
reservations of the current length + `kv_growth_tokens` on every pool) and off (admit everything, preempt).
On a checkout without `kv_admission` (before it existed) only the `off` rows are written.
"""

from __future__ import annotations

import argparse
import csv
import time

from tokenrouter.core.config import SchedulerConfig
from tokenrouter.deploy import DeploymentOverrides, resolve_deployment
from tokenrouter.sim.run import SimConfig, run_sim

NS = (2, 3, 4, 6, 8, 12, 16, 32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--num-requests", type=int, default=128)
    args = p.parse_args()
    modes = ("on", "off") if hasattr(SchedulerConfig(), "kv_admission") else ("off",)
    rows = []
    for mode in modes:
        for n in NS:
            dep = resolve_deployment(None, DeploymentOverrides(hop_rate=0.1, policy="eager"))
            cfg = SimConfig(dep, concurrency=n, num_requests=args.num_requests)
            for m in cfg.deployment.models:
                m.kv_budget_gb = 1.0
            if len(modes) == 2:
                cfg.deployment.scheduler.kv_admission = mode == "on"
            t = time.perf_counter()
            res = run_sim(cfg)
            s = res.summary
            rows.append(
                {
                    "admission": mode,
                    "N": n,
                    "steady_tok_s": round(s.get("steady_output_throughput_tok_s", float("nan")), 1),
                    "output_tok_s": round(s["output_throughput_tok_s"], 1),
                    "preemptions": res.preemptions,
                    "completed": int(s["requests_completed"]),
                    "kv_tokens": "/".join(map(str, res.kv_tokens)),
                    "wall_s": round(time.perf_counter() - t, 1),
                }
            )
            print(rows[-1], flush=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
