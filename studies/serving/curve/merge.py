"""One curve from the cells of several `run_curve.py` runs (a whole curve needs more than one 10-minute call).

    python studies/serving/curve/merge.py --out studies/serving/curve/2026-12-04-merged \
        studies/serving/curve/2026-12-04-tuned-n4-64 studies/serving/curve/2026-12-04-tuned-n8-128 ...

Reads each run's curve.csv in the order given; a cell (server, N, outputs) measured by more than one run is taken
from the first that has it, so name the runs in the order you trust them (e.g. the routed and std-serving cells of
one machine first, so their ratios stay on one machine). Writes OUT/curve.csv (with a `run` column), curve.json
(the issue's keys over the merged cells, each cell's run) and curve.png. Reads only files; no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_curve import headline_keys, plot

CELL = ["server", "N", "max_output"]


def merge(runs: list[Path]) -> pd.DataFrame:
    """The cells of `runs` (folders holding curve.csv), the first run's cell kept where several measured one."""
    frames = []
    for run in runs:
        csv = run / "curve.csv"
        if not csv.is_file():
            raise SystemExit(f"error: no curve.csv in {run}")
        frames.append(pd.read_csv(csv).assign(run=run.name))
    df = pd.concat(frames, ignore_index=True).drop_duplicates(CELL, keep="first")
    return df.sort_values(["server", "max_output", "N"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, nargs="+", help="run_curve.py output folders, most trusted first")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    df = merge(a.runs)
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "curve.csv", index=False)
    rows = df.to_dict("records")
    cells = {f"{r['server']}/{r['N']}/{r['max_output']}": r["run"] for r in rows}
    keys = headline_keys(rows)
    (a.out / "curve.json").write_text(json.dumps({**keys, "runs": [str(r) for r in a.runs], "cells": cells}, indent=1))
    plot(rows, a.out / "curve.png")
    print(json.dumps(keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
