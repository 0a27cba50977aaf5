"""Fit the simulator's standard-serving costs (profile field `std_serving`) to live std-serving cells.

    python studies/serving/fit_std_serving.py --config studies/serving/headline.yaml \
        --cells studies/serving/results/DATE/headline.csv [--write calibration/profiles/h200-measured.json]

The simulator prices every re-matched row of a standard-serving step at `hop_overhead_ms + hop_overhead_ms_per_ktok *
prefix / 1000` (docs/baselines.md section 3). This script simulates each live std-serving cell (rows whose `server`
is `std-serving`: N, workload, max output, request count as run) over the two coefficients and keeps the pair that
minimizes the squared log error of the whole-run output throughput (Nelder-Mead: a simulated run is piecewise
constant in the costs). With one prompt length only the constant term is fitted, by root finding (the per-ktok term
needs two). `--write` stores the fit in a
profile, with the cells and the residuals in its notes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

import msgspec
import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize

from tokenrouter.calibration.profile import Profile, StdServingInfo
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.core.config import load_config
from tokenrouter.core.names import Baseline
from tokenrouter.core.policy import PolicyKind
from tokenrouter.sim.run import SimConfig, cost_model, run_sim


def simulate(dep, profile: Profile, cell: pd.Series, h0: float, h1: float) -> float:
    prof = msgspec.structs.replace(profile, std_serving=StdServingInfo(hop_overhead_ms=h0, hop_overhead_ms_per_ktok=h1))
    mo = None if pd.isna(cell["max_output"]) else int(cell["max_output"])
    cfg = SimConfig(dep, workload=str(cell["workload"]), num_requests=int(cell["requests"]),
                    concurrency=int(cell["N"]), seed=0, max_output=mo, cost=cost_model(dep, prof))  # fmt: skip
    return float(run_sim(cfg).summary["output_throughput_tok_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the deployment the cells served")
    p.add_argument("--cells", required=True, nargs="+", help="headline.csv files of studies/serving/headline.py")
    p.add_argument("--profile", default=None, help="profile to start from (default: the config's)")
    p.add_argument("--write", default=None, help="profile JSON to write the fitted std_serving into")
    a = p.parse_args()
    dep = load_config(a.config)
    dep = dataclasses.replace(
        dep, baseline=Baseline.STD_SERVING, policy=dataclasses.replace(dep.policy, kind=PolicyKind.EAGER)
    )
    profile = load_profile(a.profile or dep.profile)
    df = pd.concat([pd.read_csv(f) for f in a.cells])
    cells = df[df["server"] == "std-serving"].reset_index(drop=True)
    if cells.empty:
        print("no std-serving rows in the cells", file=sys.stderr)
        return 2
    live = cells["output_throughput_tok_s"].to_numpy(float)
    one_length = cells["workload"].nunique() == 1 and cells["max_output"].nunique(dropna=False) == 1

    def errors(h0: float, h1: float) -> np.ndarray:
        sim = np.array([simulate(dep, profile, c, h0, h1) for _, c in cells.iterrows()])
        return np.log(sim / live)

    def resid(x: np.ndarray) -> np.ndarray:
        return errors(float(x[0]), 0.0 if one_length else float(x[1]))

    old = profile.std_serving
    if one_length:  # throughput falls as the per-hop cost grows: a root of the one residual, or 0 if even 0 is slow
        f = lambda h: float(resid(np.array([h]))[0])  # noqa: E731
        h0 = 0.0 if f(0.0) <= 0 else brentq(f, 0.0, 50.0, xtol=1e-3) if f(50.0) < 0 else 50.0
        h1 = 0.0
    else:  # a simulated run is piecewise constant in the costs: a coarse grid, then a derivative-free search
        loss = lambda x: float(np.sum(resid(np.abs(x)) ** 2))  # noqa: E731
        grid = [(g0, g1) for g0 in (0.0, 0.25, 0.5, 1.0, 2.0) for g1 in (0.0, 0.25, 0.5, 1.0, 2.0)]
        start = np.array(min(grid, key=lambda g: loss(np.array(g))))
        simplex = np.array([start, start + np.array([0.1, 0.0]), start + np.array([0.0, 0.1])])
        fit = minimize(loss, start, method="Nelder-Mead",
                       options={"initial_simplex": simplex, "xatol": 1e-2, "fatol": 1e-5, "maxfev": 60})  # fmt: skip
        h0, h1 = (float(v) for v in np.abs(fit.x))
    before, after = errors(old.hop_overhead_ms, old.hop_overhead_ms_per_ktok), errors(h0, h1)
    rows = [{"N": int(c["N"]), "workload": c["workload"], "max_output": None if pd.isna(c["max_output"]) else
             int(c["max_output"]), "live_tok_s": float(lv), "sim_before": float(lv * math.exp(b)),
             "sim_after": float(lv * math.exp(f))}
            for (_, c), lv, b, f in zip(cells.iterrows(), live, before, after, strict=True)]  # fmt: skip
    out = {"hop_overhead_ms": round(h0, 4), "hop_overhead_ms_per_ktok": round(h1, 4),
           "before": {"hop_overhead_ms": old.hop_overhead_ms, "hop_overhead_ms_per_ktok": old.hop_overhead_ms_per_ktok},
           "per_ktok_fitted": not one_length, "cells": rows}  # fmt: skip
    print(json.dumps(out, indent=1))
    if a.write:
        prof = load_profile(a.write)
        notes = dict(prof.notes or {})
        term = "kept 0 (one prompt length)" if one_length else "fitted"
        residuals = [round(float(r), 4) for r in after]
        notes["std_serving"] = (f"fitted by studies/serving/fit_std_serving.py to {len(rows)} live std-serving "
                                f"cell(s) ({', '.join(a.cells)}); per-ktok term {term}; residuals (log sim/live) "
                                f"{residuals}")  # fmt: skip
        new = msgspec.structs.replace(prof, std_serving=StdServingInfo(hop_overhead_ms=round(h0, 4),
                                                                       hop_overhead_ms_per_ktok=round(h1, 4)),
                                      notes=notes)  # fmt: skip
        new.save(a.write)
        print(f"wrote {a.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
