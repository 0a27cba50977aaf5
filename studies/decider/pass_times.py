"""What each model's passes carry and cost in a served run, beside the simulator's price for the same passes.

One server (the runtime's own client, no HTTP) with step logs; for each B in `--bs` the policy is set between
loads (`SetPolicy`, as the admin endpoint does) and a closed loop of N clients runs `--requests` requests
(prompt 100, outputs `--output` tokens, greedy, ignore EOS). Each logged step carries its rows' tokens and
contexts (`tokenrouter.steplog.step_record`), so `--summarize` rebuilds every pass, splits it with the model's
`GraphRule` as the engine did, and prices it alone with the profile's cost model (`calibration.cost`): live GPU
ms over the alone price is the co-run factor the simulator should have applied, per B and per size of pass.
`--std-serving` serves the baseline instead (a model server per model and the dispatcher) for `--repeats` loads in
a row: the same table per load, and whether a later load runs slower than the first.

    python3 studies/decider/pass_times.py --config studies/serving/headline.yaml --out OUT -n 64 \
        --bs "17,36;25,40"                                                                  # on the GPU
    python3 studies/decider/pass_times.py --summarize OUT --config studies/serving/headline.yaml  # anywhere
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path


def parse_bs(text: str) -> list[list[int]]:
    return [[int(x) for x in b.split(",")] for b in text.split(";") if b.strip()]


def set_b(srv, client, seq: int, policy, timeout_s: float = 30.0) -> None:
    """Every subserver runs `policy` before the next request (acknowledged by `PolicySet`)."""
    import zmq

    from tokenrouter.runtime import protocol as P

    socks = []
    for addr in srv.addresses.subservers:
        s = client.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 1000)
        s.connect(addr)
        s.send_multipart([P.CTL, P.encode(P.SetPolicy(seq, policy, None))])
        socks.append(s)
    acks: set[int] = set()
    while len(acks) < len(socks):
        ev = client.until(lambda e: isinstance(e, P.PolicySet) and e.seq == seq, timeout_s)[-1]
        if ev.error:
            raise RuntimeError(f"model {ev.model} refused B: {ev.error}")
        acks.add(ev.model)
    for s in socks:
        s.close()


def load(srv, client, n: int, reqs: int, output: int, tag: str) -> tuple[float, float, int]:
    """A closed loop of `n` clients over `reqs` requests: (start, end, output tokens)."""
    from tokenrouter.runtime import protocol as P
    from tokenrouter.workloads import RequestSpec, request_ids, request_seed

    specs = [RequestSpec(f"{tag}-r{i}", 100, output, None) for i in range(reqs)]
    jobs = [(s.rid, request_ids(s, 0), P.Sampling(temperature=0.0, max_tokens=output, ignore_eos=True,
                                                   seed=request_seed(s, 0))) for s in specs]  # fmt: skip
    t0 = time.monotonic()
    client.closed_loop(jobs, n)
    return t0, time.monotonic(), reqs * output


def run(a: argparse.Namespace) -> None:
    from tokenrouter.core.config import load_config
    from tokenrouter.runtime.client import RuntimeClient
    from tokenrouter.runtime.launcher import Server

    base = load_config(a.config)
    marks = []
    if a.std_serving:  # the baseline has no B: each load is one cell, the same server throughout
        from tokenrouter.baselines.launcher import BaselineServer

        srv_cm = BaselineServer(base, "std-serving", device=a.device, step_logs=True, run_dir=a.out / "run")
        bs: list[list[int] | None] = [None] * a.repeats
    else:
        srv_cm = Server(base, device=a.device, step_logs=True, run_dir=a.out / "run")
        bs = parse_bs(a.bs) * a.repeats
    with srv_cm as srv:
        client = RuntimeClient(srv.addresses)
        try:
            for k, b in enumerate(bs):
                if b is not None:
                    set_b(srv, client, k + 1, replace(base.policy.with_thresholds(b)))
                t0, t1, toks = load(srv, client, a.n, a.requests or 4 * a.n, a.output, f"c{k}")
                marks.append({"B": b, "t0": t0, "t1": t1, "tok_s": toks / (t1 - t0)})
                print(f"B={b}: {toks / (t1 - t0):.1f} tok/s", flush=True)
        finally:
            client.close()
    (a.out / "marks.json").write_text(json.dumps({"n": a.n, "output": a.output, "marks": marks}, indent=1))


def read_steps(out: Path) -> list[dict]:
    steps = []
    run_dir = out / "run" if (out / "run").is_dir() else out  # as the run wrote it, or as committed
    for f in sorted(run_dir.glob("steps*.jsonl*")):  # as written, or gzipped
        with gzip.open(f, "rt") if f.suffix == ".gz" else f.open() as fh:
            steps += [json.loads(line) for line in fh if line.strip()]
    return steps


def alone_ms(cost, rule, step: dict) -> float:
    """The cost model's price of the logged pass alone on the GPU (the split the engine made, by `rule`)."""
    from tokenrouter.calibration.step_stats import StepStats
    from tokenrouter.core.batch import Batch, BatchRow
    from tokenrouter.core.request import Request

    req = Request("x", [0], 1)
    rows = [BatchRow(req, c - t, t) for t, c in zip(step["row_tokens"], step["row_ctx"], strict=True)]
    return cost.step_ms(StepStats.of_batch(Batch(0, step["model"], rows), rule))


def summarize(out: Path, config: Path, profile: str | None) -> dict:
    from tokenrouter.calibration.cost import CostModel
    from tokenrouter.core.config import load_config

    cfg = load_config(config)
    names = [m.name for m in cfg.models]
    cm = CostModel(profile or cfg.profile, models=names)
    costs = [cm.for_model(i) for i in range(len(names))]
    rules = [m.graph_rule() for m in cfg.models]
    meta = json.loads((out / "marks.json").read_text())
    steps = read_steps(out)
    res: dict = {"n": meta["n"], "cells": []}
    for mk in meta["marks"]:
        cell: dict = {"B": mk["B"], "tok_s": round(mk["tok_s"], 1)}
        wall = mk["t1"] - mk["t0"]
        for i, name in enumerate(names):
            part = [s for s in steps if s["model"] == i and mk["t0"] <= s["launch"] <= mk["t1"]]
            if not part:
                continue
            live = [s["gpu_ms"] for s in part]
            alone = [alone_ms(costs[i], rules[i], s) for s in part]
            big = [s for s, a in zip(part, alone, strict=True) if s["ext_tokens"] > 0]
            cell[name] = {
                "passes": len(part),
                "rows": round(statistics.mean(s["rows"] for s in part), 1),
                "tokens": round(statistics.mean(s["tokens"] for s in part), 1),
                "ext_passes": len(big),
                "ext_tokens_per_ext_pass": round(statistics.mean(s["ext_tokens"] for s in big), 1) if big else 0,
                "live_gpu_ms": round(statistics.mean(live), 2),
                "alone_price_ms": round(statistics.mean(alone), 2),
                "live_over_alone": round(sum(live) / sum(alone), 3) if sum(alone) else None,
                "busy_live": round(sum(live) / 1e3 / wall, 3),
                "by_varlen_bucket": by_bucket(part, alone),
            }
        res["cells"].append(cell)
    return res


def by_bucket(part: list[dict], alone: list[float]) -> dict:
    """Live GPU ms and the alone price per path the engine took (decode graph bucket / varlen bucket / eager)."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for s, a in zip(part, alone, strict=True):
        key = f"varlen:{s['varlen']}" if s.get("varlen") else (f"decode:{s['graph']}" if s.get("graph") else "eager")
        groups.setdefault(key, []).append((s["gpu_ms"], a))
    return {k: {"passes": len(v), "live_ms": round(statistics.mean(x for x, _ in v), 2),
                "alone_ms": round(statistics.mean(y for _, y in v), 2)}
            for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:6]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--summarize", type=Path, help="summarize a run's folder (no GPU needed)")
    p.add_argument("--profile", default=None, help="profile to price with (default: the config's)")
    p.add_argument("-n", type=int, default=64)
    p.add_argument("--bs", default="17,36;25,40", help="B values, 'a,b;c,d'")
    p.add_argument("--repeats", type=int, default=1, help="run the B list this many times, alternating")
    p.add_argument("--std-serving", action="store_true",
                   help="serve the std-serving baseline (no B): --repeats loads in a row on one server")  # fmt: skip
    p.add_argument("--requests", type=int, default=0, help="requests per load (default 4N)")
    p.add_argument("--output", type=int, default=256)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    if a.summarize:
        print(json.dumps(summarize(a.summarize, a.config, a.profile), indent=1))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    run(a)
    print(json.dumps(summarize(a.out, a.config, a.profile), indent=1))


if __name__ == "__main__":
    main()
