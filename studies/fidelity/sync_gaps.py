"""Where a sync policy's step time goes live: each subserver's step log (launch, done, GPU ms per step) under
step-sync and eager, N = 1 and N = 8, on the real pair (one server per policy, no HTTP: the runtime's own client).

The simulator charges a step without overlap its host time plus the coordinator's round trips
(`sim.subserver`); this measures what the serving loop actually leaves idle between one step's end and the next
launch (`gap`), and what a launch costs beyond its GPU time (`launch_to_done - gpu`), per model.

    python3 studies/fidelity/sync_gaps.py --config studies/decider/tuned-2026-12-02.yaml --out OUT   # on the GPU
    python3 studies/fidelity/sync_gaps.py --summarize OUT                                              # anywhere
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from dataclasses import replace
from pathlib import Path


def run(config: Path, out: Path, device: str, output_len: int) -> None:
    from tokenrouter.core.config import PolicyConfig, load_config
    from tokenrouter.runtime import protocol as P
    from tokenrouter.runtime.client import RuntimeClient
    from tokenrouter.runtime.launcher import Server
    from tokenrouter.workloads import RequestSpec, request_ids, request_seed

    base = load_config(config)
    for policy in ("step-sync", "eager"):
        cfg = replace(base, policy=PolicyConfig(kind=policy))
        run_dir = out / policy
        with Server(cfg, device=device, step_logs=True, run_dir=run_dir) as srv:
            client = RuntimeClient(srv.addresses)
            try:
                for n, reqs in ((1, 8), (8, 16)):
                    specs = [RequestSpec(f"n{n}-r{i}", 100, output_len, None) for i in range(reqs)]
                    client.closed_loop([(s.rid, request_ids(s, 0), P.Sampling(
                        temperature=0.0, max_tokens=output_len, ignore_eos=True, seed=request_seed(s, 0)))
                        for s in specs], n)  # fmt: skip
                    (run_dir / f"n{n}.done").write_text("")
            finally:
                client.close()
        print(policy, "done", flush=True)


def summarize(out: Path) -> dict:
    res: dict = {}
    for policy_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        steps = []
        for f in sorted(policy_dir.glob("steps*.jsonl*")):  # as written, or gzipped as committed
            with gzip.open(f, "rt") if f.suffix == ".gz" else f.open() as fh:
                text = fh.read()
            steps += [json.loads(line) for line in text.splitlines() if line.strip()]
        steps.sort(key=lambda s: s["launch"])
        # The two phases run one after the other: N = 1 steps carry one row, N = 8 opens with a step of several.
        cut = next((i for i, s in enumerate(steps) if s["rows"] > 1), len(steps))
        for n, part in ((1, steps[:cut]), (8, steps[cut:])):
            gaps, over = {0: [], 1: []}, {0: [], 1: []}
            last_done = None
            for s in part:
                if last_done is not None and s["launch"] >= last_done:  # nothing ran between: an idle gap
                    gaps[s["model"]].append((s["launch"] - last_done) * 1e3)
                over[s["model"]].append((s["done"] - s["launch"]) * 1e3 - s["gpu_ms"])
                last_done = s["done"] if last_done is None else max(last_done, s["done"])
            wall = part[-1]["done"] - part[0]["launch"] if part else 0.0
            res[f"{policy_dir.name} N={n}"] = {
                "steps": [sum(1 for s in part if s["model"] == m) for m in (0, 1)],
                "wall_s": round(wall, 3),
                "gpu_s": [round(sum(s["gpu_ms"] for s in part if s["model"] == m) / 1e3, 3) for m in (0, 1)],
                "idle_gap_ms_median": [round(statistics.median(gaps[m]), 3) if gaps[m] else None for m in (0, 1)],
                "idle_gaps": [len(gaps[m]) for m in (0, 1)],
                "launch_to_done_minus_gpu_ms_median": [
                    round(statistics.median(over[m]), 3) if over[m] else None for m in (0, 1)
                ],
            }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summarize", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--output-len", type=int, default=256)
    a = ap.parse_args()
    if a.summarize is None:
        if a.config is None or a.out is None:
            ap.error("--config and --out (or --summarize DIR)")
        run(a.config, a.out, a.device, a.output_len)
    target = a.summarize or a.out
    summary = summarize(target)
    (target / "summary.json").write_text(json.dumps(summary, indent=1))
    for k, v in summary.items():
        print(k, v)


if __name__ == "__main__":
    main()
