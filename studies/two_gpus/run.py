"""Two GPUs: separate GPUs against MPS on one GPU, live, with the simulator's prediction beside every cell; the
tensor-parallel numbers of `tp_bench.py` merged in.

    python studies/two_gpus/run.py --dry-run                   # any machine: the cells and the predictions
    python studies/two_gpus/run.py                             # a 2-GPU H200 host: serve, bench, summarise
    python studies/two_gpus/run.py --device cpu --out OUT      # CPU smoke of the script on the tiny pair

Pair: Qwen3-0.6B + Qwen3-32B, dummy weights, synthetic R2R router at hop rate 0.1, low-effort workload capped at
256 output tokens, max(8, 3N) requests per cell, N closed-loop clients, seed 0 (the fidelity study's cells). Each
layout gets its own B per N, chosen by the tuner on the bundled measured profile (`h200`): `mps` (both on GPU 0),
`separate` (0.6B on GPU 0, 32B on GPU 1) and, predicted only unless `--live` names it, `tp` (32B at tp=2 over
GPUs 0 and 1, the 0.6B beside it on GPU 0). Predictions: the simulator on the same cell, with the alone profiles for
`separate`, the measured co-location grid for `mps`, and for `tp` the cost model's estimate from the tp=1
measurement (labelled estimated). `--device cpu` swaps in the tiny pair and the analytic profile: it checks the
script end to end and measures nothing about GPUs. A second call with the same --out keeps the cells already in
OUT/cells.csv and runs only the missing ones (e.g. `--live mps`, then `--live separate`, one device call each).

Writes OUT/summary.json (`separate_over_mps_n8`, `tp2_over_tp1_b1`, `tp2_greedy_equal`, each with `measured` and
`predicted`), OUT/cells.csv (one row per cell: live and simulated), OUT/cells/<layout>-n<N>.csv (the bench's
per-request rows), the tuned configs OUT/serve-<layout>.yaml and the server logs. OUT defaults to
studies/two_gpus/results/<date>. `tp_bench.py`'s JSON is read from --tp-bench (default OUT/tp_bench.json) when it
exists.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.names import Layout
from tokenrouter.deploy import DeploymentOverrides, resolve_deployment
from tokenrouter.deploy.placement import gpus_used, layout
from tokenrouter.sim.run import SimConfig, estimated_notes, run_sim
from tokenrouter.sim.simulate import sim_config
from tokenrouter.sim.tune import Candidate, choose, tune_point

HERE = Path(__file__).resolve().parent
PAIRS = {"cuda": ("qwen3-0.6b", "qwen3-32b", "h200"), "cpu": ("tiny-small", "tiny-large", "h200-analytic")}
LIVE_KEYS = ("output_throughput_tok_s", "ttft_ms_p50", "tpot_ms_p50", "e2e_ms_mean", "hops_mean",
             "requests_completed", "requests_failed")  # fmt: skip
TP_CONTEXT = 1024  # context per row of the batch-1 decode step the tp prediction prices


def requests_for(n: int) -> int:
    return max(8, 3 * n)


def base_overrides(a: argparse.Namespace) -> DeploymentOverrides:
    small, large, profile = PAIRS[a.device]
    return DeploymentOverrides(small=small, large=large, router="r2r", hop_rate=a.hop_rate, policy="delayed",
                               profile=a.profile or profile, max_batch_tokens=2048)  # fmt: skip


def tune_layout(lay: Layout, a: argparse.Namespace, ns: list[int]) -> Candidate:
    """The layout on 2 GPUs with B tuned per N (as `trsim tune --placements` does it), its config ready to serve."""
    ov = base_overrides(a)
    mode, tps = layout(lay, 2, resolve_deployment(None, ov))
    ov.placement, ov.tp = mode, tps
    flags = DeploymentFlags(None, ov)
    points, cfg = [], None
    for n in ns:
        cfg, _ = sim_config(flags.resolve(), flags.b_choice, concurrency=n, workload=a.workload,
                            num_requests=max(32, 4 * n), seed=0, max_output=a.max_output)  # fmt: skip
        points.append(tune_point(cfg, n))
    assert cfg is not None
    dep = copy.deepcopy(cfg.deployment)
    dep.policy = dep.policy.with_thresholds(points[-1].best, {p.concurrency: p.best for p in points})
    dep.notes = {"tuned_by": "studies/two_gpus/run.py (trsim tune's tune_point)", "layout": str(lay),
                 "points": [{"N": p.concurrency, "B": list(p.best), "sim_tok_s": round(p.best_throughput, 1)}
                            for p in points]}  # fmt: skip
    return Candidate(str(lay), dep, points, gpus_used(dep), lay, None, estimated_notes(dep))


def predict_cell(c: Candidate, n: int, a: argparse.Namespace) -> dict[str, float]:
    """The simulator on exactly the live cell: the served config (its B table), N clients, the cell's requests."""
    cfg = SimConfig(copy.deepcopy(c.deployment), workload=a.workload, num_requests=requests_for(n), concurrency=n,
                    seed=0, max_output=a.max_output)  # fmt: skip
    return run_sim(cfg).summary


def tp_step_prediction(a: argparse.Namespace) -> dict[str, Any]:
    """The large model's decode step at batch 1 at tp=1 and tp=2 on the profile (tp=2 estimated unless measured)."""
    _, large, profile = PAIRS[a.device]
    stats = StepStats.uniform(1, 1, TP_CONTEXT, GraphRule())
    ms, notes = {}, []
    for tp in (1, 2):
        mc = CostModel(a.profile or profile, "separate", models=[large], tp=[tp]).for_model(0)
        ms[f"tp{tp}"] = round(mc.step_ms(stats), 3)
        notes += [mc.estimated] if mc.estimated else []
    return {"predicted": round(ms["tp1"] / ms["tp2"], 3), "predicted_step_ms": ms, "estimated": notes,
            "meaning": f"{large} decode tokens/s at batch 1 ({TP_CONTEXT} context, CUDA graphs), tp=2 over tp=1 "
                       "(= step time at tp=1 / step time at tp=2)"}  # fmt: skip


def print_predictions(cands: dict[str, Candidate], preds: dict[tuple[str, int], dict], ns: list[int],
                      tp: dict[str, Any], verdict: dict[str, Any]) -> None:  # fmt: skip
    """The prediction table (markdown, as the README shows it)."""
    print("| N | " + " | ".join(f"{k} tok/s (B)" for k in cands) + " | separate / mps |")
    print("|---|" + "---|" * len(cands) + "---|")
    for n in ns:
        cells = []
        for k, c in cands.items():
            b = ",".join(map(str, c.point(n).best))
            est = " est." if c.estimated else ""
            cells.append(f"{preds[(k, n)]['output_throughput_tok_s']:,.0f} ({b}){est}")
        ratio = preds[("separate", n)]["output_throughput_tok_s"] / preds[("mps", n)]["output_throughput_tok_s"]
        print(f"| {n} | " + " | ".join(cells) + f" | {ratio:.3f} |")
    print()
    print(f"tp2_over_tp1_b1 predicted {tp['predicted']} ({tp['meaning']}; step ms {tp['predicted_step_ms']})")
    print(f"tune's choice at N={verdict['N']} over these layouts on 2 GPUs: total -> {verdict['total']}, "
          f"per-GPU -> {verdict['per-gpu']}")  # fmt: skip
    for note in dict.fromkeys(n for c in cands.values() for n in c.estimated):
        print(f"note: {note}")


def machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(), "device": device}
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def run_live(cands: dict[str, Candidate], live: list[str], ns: list[int], a: argparse.Namespace,
             out: Path, preds: dict, t_start: float) -> list[dict]:  # fmt: skip
    from tokenrouter.bench.server import TR, start_server, stop_server

    # A second call with the same OUT keeps the cells measured before and runs only the missing ones (one call
    # per layout fits a device time limit).
    done = pd.read_csv(out / "cells.csv").to_dict("records") if (out / "cells.csv").exists() else []
    rows: list[dict] = [r for r in done if r["layout"] in cands and r["N"] in ns]
    have = {(r["layout"], r["N"]) for r in rows}
    (out / "cells").mkdir(parents=True, exist_ok=True)
    port = a.port
    for k in live:
        c = cands[k]
        cfg_path = out / f"serve-{k}.yaml"
        if all((k, n) in have for n in ns):
            print(f"{k}: every cell measured already ({out / 'cells.csv'})", flush=True)
            continue
        if time.monotonic() - t_start > a.deadline - 120:
            print(f"skip {k}: deadline", flush=True)
            continue
        port += 1
        log = out / f"serve-{k}.log"
        proc, url, up = start_server(["--config", str(cfg_path), "--device", a.device, "--no-access-log"], port, log)
        if up is None:
            print(f"server {k} did not come up:\n{log.read_text()[-2000:]}", flush=True)
            continue
        print(f"server {k}: up in {up:.0f} s", flush=True)
        try:
            for n in ns:
                if (k, n) in have:
                    continue
                if time.monotonic() - t_start > a.deadline - 25:
                    print(f"skip {k} N={n}: deadline", flush=True)
                    continue
                jf = out / "cell.json"
                cmd = [*TR, "bench", "--url", url, "-n", str(n), "--num-requests", str(requests_for(n)),
                       "--workload", a.workload, "--max-output", str(a.max_output), "--seed", "0", "--json", str(jf),
                       "--csv", str(out / "cells" / f"{k}-n{n}.csv")]  # fmt: skip
                t0 = time.monotonic()
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if res.returncode != 0 or not jf.exists():
                    print(f"{k} N={n}: bench failed: {(res.stderr or res.stdout)[-300:]}", flush=True)
                    continue
                rec = json.loads(jf.read_text())
                jf.unlink()
                sim = preds[(k, n)]
                live_tok = rec.get("output_throughput_tok_s") or float("nan")
                row = {"layout": k, "N": n, "B": ",".join(map(str, c.point(n).best)), "gpus": c.gpus,
                       "requests": requests_for(n), "wall_s": round(time.monotonic() - t0, 1),
                       **{f"live_{key}": rec.get(key) for key in LIVE_KEYS},
                       "live_tok_s_per_gpu": live_tok / c.gpus,
                       **{f"sim_{key}": sim.get(key) for key in LIVE_KEYS if key in sim},
                       "sim_tok_s_per_gpu": sim["output_throughput_tok_s"] / c.gpus,
                       "sim_error": sim["output_throughput_tok_s"] / live_tok - 1 if live_tok else None}  # fmt: skip
                rows.append(row)
                pd.DataFrame(rows).to_csv(out / "cells.csv", index=False)
                print(f"{k} N={n}: live {live_tok:,.1f} tok/s, simulated {sim['output_throughput_tok_s']:,.1f}",
                      flush=True)  # fmt: skip
        finally:
            stop_server(proc)
    return rows


def ratio_at(rows: list[dict], n: int, key: str) -> float | None:
    by = {r["layout"]: r[key] for r in rows if r["N"] == n and r.get(key)}
    if "separate" not in by or "mps" not in by:
        return None
    return round(by["separate"] / by["mps"], 3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="print the cells and the predictions; no server, no GPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the tiny pair, a smoke test")
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/<date>)")
    p.add_argument("--ns", default=None, help="concurrencies (default 1,4,8,16; cpu: 1,4)")
    p.add_argument("--hop-rate", type=float, default=0.1)
    p.add_argument("--workload", default="low-effort")
    p.add_argument("--max-output", type=int, default=None, help="cap output tokens (default 256; cpu: 32)")
    p.add_argument("--profile", default=None, help="profile for the predictions (default h200; cpu: h200-analytic)")
    p.add_argument("--live", default="mps,separate", help="layouts served live (tp needs the runtime's tp support)")
    p.add_argument("--tp-bench", type=Path, default=None, help="tp_bench.py's JSON (default OUT/tp_bench.json)")
    p.add_argument("--deadline", type=float, default=560.0, help="seconds; cells past it are skipped")
    p.add_argument("--port", type=int, default=8300)
    a = p.parse_args()
    t_start = time.monotonic()
    cpu = a.device == "cpu"
    ns = [int(x) for x in (a.ns or ("1,4" if cpu else "1,4,8,16")).split(",") if x]
    a.max_output = a.max_output or (32 if cpu else 256)
    live = [str(Layout(x)) for x in a.live.split(",") if x]
    cmp_n = 8 if 8 in ns else ns[-1]

    cands = {str(lay): tune_layout(lay, a, ns) for lay in (Layout.MPS, Layout.SEPARATE, Layout.TP)}
    preds = {(k, n): predict_cell(c, n, a) for k, c in cands.items() for n in ns}
    verdict: dict[str, Any] = {"N": cmp_n}
    verdict |= {obj: choose(list(cands.values()), cmp_n, obj).label for obj in ("total", "per-gpu")}
    tp = tp_step_prediction(a)
    small, large, profile = PAIRS[a.device]
    print(f"cells: {small} + {large}, r2r hop rate {a.hop_rate}, {a.workload} capped at {a.max_output} tokens, "
          f"max(8, 3N) requests, N = {','.join(map(str, ns))}; live layouts {','.join(live)}; predictions on "
          f"profile {a.profile or profile}")  # fmt: skip
    print_predictions(cands, preds, ns, tp, verdict)
    if a.dry_run:
        print("dry run: nothing was served or measured; the numbers above are the simulator's predictions")
        return 0

    out = a.out or HERE / "results" / dt.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    for k, c in cands.items():
        c.deployment.save(out / f"serve-{k}.yaml")
    rows = run_live(cands, live, ns, a, out, preds, t_start)
    tp_file = a.tp_bench or out / "tp_bench.json"
    tp_bench = json.loads(tp_file.read_text()) if tp_file.exists() else None
    sim_ratio = {n: round(preds[("separate", n)]["output_throughput_tok_s"]
                          / preds[("mps", n)]["output_throughput_tok_s"], 3) for n in ns}  # fmt: skip
    summary = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(a.device),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "pair": [small, large],
        "cells": {
            "router": "r2r",
            "hop_rate": a.hop_rate,
            "workload": a.workload,
            "max_output": a.max_output,
            "requests": "max(8, 3N)",
            "ns": ns,
            "seed": 0,
            "weights": "dummy",
        },
        "profile": a.profile or profile,
        f"separate_over_mps_n{cmp_n}": {
            "measured": ratio_at(rows, cmp_n, "live_output_throughput_tok_s"),
            "predicted": sim_ratio[cmp_n],
            "meaning": f"output tok/s at N={cmp_n}, separate GPUs over MPS on one GPU, each with its tuned B",
        },
        "tp2_over_tp1_b1": {"measured": (tp_bench or {}).get("tp2_over_tp1_b1"), **tp},
        "tp2_greedy_equal": {
            "measured": (tp_bench or {}).get("tp2_greedy_equal"),
            "predicted": None,
            "meaning": "tp=2 greedy output equals tp=1's token for token: a correctness check, not "
            "a simulator quantity",
        },
        "separate_over_mps_by_n": {
            str(n): {"measured": ratio_at(rows, n, "live_output_throughput_tok_s"), "predicted": sim_ratio[n]}
            for n in ns
        },
        "tune_choice_at_n": verdict,
        "predicted_tok_s": {k: {str(n): round(preds[(k, n)]["output_throughput_tok_s"], 1) for n in ns} for k in cands},
        "estimated": list(dict.fromkeys(n for c in cands.values() for n in c.estimated)),
        "tp_bench": tp_bench,
        "tp_bench_file": str(tp_file) if tp_bench is not None else None,
        "cells_measured": len(rows),
    }
    (out / "summary.json").write_text(json.dumps(_clean(summary), indent=2) + "\n")
    print(f"wrote {out / 'summary.json'} ({len(rows)} cells measured, {time.monotonic() - t_start:.0f} s)")
    return 0 if rows else 1


def _clean(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


if __name__ == "__main__":
    sys.exit(main())
