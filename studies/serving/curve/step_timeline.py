"""Where a cell's time goes, live beside simulated: each model's steps (rows, tokens, host and device ms, the share
of the run its passes held the GPU, the gap between its passes) and the share with no pass running.

    python studies/serving/curve/run_curve.py ... --step-logs --out OUT     # on the GPU: cells with step logs
    python studies/serving/curve/step_timeline.py OUT [--cells routed/8/8192]  # anywhere (CPU): this table
    python studies/serving/curve/step_timeline.py PASS_TIMES_OUT --config CONFIG   # studies/decider/pass_times.py runs

Live: the server's step logs (a curve's `OUT/steps_<server>/`; a pass_times run's `OUT/run/`; plain or gzipped)
cut to the steps that ended inside the cell's window (cells.json; marks.json), the window then narrowed to those
steps' first launch and last end. Simulated: `trsim run` of the same cell (the config, the policy or B, N,
requests, workload, output cap, seed 0) with `--step-logs`, over its whole run (a pass_times load's request ids
differ from `trsim`'s, so its hops are drawn alike but not the same). Live device times are the CUDA-event pass
times ending where the host saw them (`tokenrouter.steplog.device_interval`): they bound the pass's end from above.
Writes OUT/timeline.csv and prints the table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_curve import SERVERS

from tokenrouter.steplog import load_step_logs, timeline


def read_logs(d: Path) -> dict[int, list[dict]]:
    """Step logs of a directory as written (`steps<i>.jsonl`) or as committed (`.jsonl.gz`)."""
    gz = sorted(d.glob("steps*.jsonl.gz"))
    if not gz:
        return load_step_logs(d)
    with tempfile.TemporaryDirectory() as tmp:
        for f in gz:
            Path(tmp, f.name[: -len(".gz")]).write_bytes(gzip.decompress(f.read_bytes()))
        return load_step_logs(tmp)


def live_cell(logs: dict[int, list[dict]], window: list[float]):
    """The cell's steps: those whose host `done` lies in `window`, summarized over their own span."""
    lo, hi = window
    cut = {m: [r for r in recs if lo <= r["done"] <= hi] for m, recs in logs.items()}
    cut = {m: recs for m, recs in cut.items() if recs}
    every = [r for recs in cut.values() for r in recs]
    return timeline(cut, (min(r["launch"] for r in every), max(r["done"] for r in every)))


def curve_cells(out: Path) -> list[dict]:
    """run_curve.py's cells with a window: key, window, step-log folder and the `trsim run` flags of the cell."""
    raw = json.loads((out / "cells.json").read_text())
    cells = []
    for key, cell in raw.items():
        if key == "servers" or "window" not in cell:
            continue
        server, bench = key.split("/")[0], cell["bench"]
        flags = ["--policy", SERVERS[server][1][SERVERS[server][1].index("--policy") + 1],
                 "-n", str(bench["concurrency"]), "--num-requests", str(bench["num_requests"]),
                 "--workload", str(bench["workload"])]  # fmt: skip
        flags += ["--max-output", str(cell["max_output"])] if cell.get("max_output") else []
        cells.append({"key": key, "window": cell["window"], "logs": out / f"steps_{server}", "flags": flags})
    return cells


def marks_cells(out: Path) -> list[dict]:
    """studies/decider/pass_times.py's loads (marks.json): one cell per load, B given (None: std-serving)."""
    meta = json.loads((out / "marks.json").read_text())
    logs = out / "run" if (out / "run").is_dir() else out
    cells = []
    for k, mk in enumerate(meta["marks"]):
        reqs = round(mk["tok_s"] * (mk["t1"] - mk["t0"]) / meta["output"])
        b = ["--policy", "std-serving"] if mk["B"] is None else ["--thresholds", ",".join(map(str, mk["B"]))]
        flags = [*b, "-n", str(meta["n"]), "--num-requests", str(reqs), "--workload", f"fixed:100,{meta['output']}"]
        cells.append({"key": f"{k}:B={mk['B']}", "window": [mk["t0"], mk["t1"]], "logs": logs, "flags": flags})
    return cells


def sim_cell(config: str, flags: list[str]) -> dict[int, list[dict]]:
    """The simulator's step logs of the same cell (`trsim run` in a subprocess, as a user would run it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["trsim", "run", "--config", config, *flags, "--seed", "0", "--step-logs", str(Path(tmp) / "s")]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return load_step_logs(Path(tmp) / "s")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("out", type=Path, help="a run_curve.py --step-logs output folder, or a pass_times.py one")
    p.add_argument(
        "--cells",
        default="",
        help="comma list of cell keys (curve: server/N/max_output; pass_times: "
        "index:B=[..]); default: every cell with logs",
    )
    p.add_argument("--config", default="", help="the deployment config (default: the one the curve ran)")
    a = p.parse_args()
    curve = (a.out / "cells.json").exists()
    if not curve and not a.config:
        p.error("a pass_times.py folder needs --config (the deployment it served)")
    config = a.config or json.loads((a.out / "curve.json").read_text())["command"].split("--config ")[1].split()[0]
    want = [c for c in a.cells.split(",") if c]
    rows = []
    for cell in curve_cells(a.out) if curve else marks_cells(a.out):
        if want and cell["key"] not in want:
            continue
        if not cell["logs"].is_dir():
            print(f"{cell['key']}: no step logs in {cell['logs']}")
            continue
        for source, tl in (("live", live_cell(read_logs(cell["logs"]), cell["window"])),
                           ("sim", timeline(sim_cell(config, cell["flags"])))):  # fmt: skip
            span = tl.window_s[1] - tl.window_s[0]
            rows += [{"cell": cell["key"], "source": source, "span_s": span, **r} for r in tl.rows()]
    if not rows:
        print("no cell with step logs")
        return 1
    df = pd.DataFrame(rows)
    df.to_csv(a.out / "timeline.csv", index=False)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
