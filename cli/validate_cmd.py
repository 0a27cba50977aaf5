"""`trsim validate LIVE.csv`: simulate every cell of a live-results file and print the simulator's error (the file's
columns, its path rule and the exit code: docs/simulator.md, Checking against live runs)."""

from __future__ import annotations

import json
import math
import shlex
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.cli.common import USAGE_ERRORS, CliError, check_output
from tokenrouter.cli.options import parse_run_args
from tokenrouter.cli.progress import counted, progress_bar
from tokenrouter.sim.run import SimConfig, prepare_sim
from tokenrouter.sim.simulate import sim_config, simulate

METRICS = {"throughput": "output_throughput_tok_s", "tpot_p50": "tpot_ms_p50"}
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".csv")


def cell_path(flag: str, value: str, base: Path) -> str:
    """One rule for the files a cell names: a relative `--config`, or a `--profile`, `--trace` or `--workload` that is
    a path (a folder or a file suffix), is relative to the CSV's folder (`base`); a name stays as it is."""
    p = Path(value)
    if p.is_absolute():
        return value
    if flag == "--config" or "/" in value or p.suffix in FILE_SUFFIXES:
        return str(base / p)
    return value


def cell_config(args: str, base: Path, profile: str | None = None) -> tuple[SimConfig, bool]:
    """The SimConfig `trsim run ARGS` would simulate (files relative to `base`, `cell_path`), and its 'auto'
    flag."""
    argv = shlex.split(args)
    for flag in ("--config", "--profile", "--trace", "--workload"):
        if flag in argv[:-1]:
            i = argv.index(flag) + 1
            argv[i] = cell_path(flag, argv[i], base)
    if profile is not None:
        argv += ["--profile", profile]
    deploy, run = parse_run_args(argv)
    return sim_config(deploy.resolve(), deploy.b_choice, **run)


def _err(sim: float, live: float) -> float:
    return float("nan") if not live or math.isnan(live) or math.isnan(sim) else sim / live - 1.0


def _summary(errs: list[float]) -> tuple[float, float]:
    a = sorted(abs(e) for e in errs if not math.isnan(e))
    if not a:
        return float("nan"), float("nan")
    return statistics.median(a), a[-1]


ProfileOpt = Annotated[str | None, typer.Option(help="Simulate with this profile instead of the one each cell "
                       "names.")]  # fmt: skip
JsonOut = Annotated[str | None, typer.Option("--json", help="Write the per-cell errors as JSON ('-' = stdout).")]


def validate(
    live: Annotated[Path, typer.Argument(help="Live-results CSV (one row per cell: args + live metrics).")],
    profile: ProfileOpt = None,
    max_median_error: Annotated[float, typer.Option(help="Fail (exit 1) above this median |throughput error|.")] = 0.03,
    max_error: Annotated[float, typer.Option(help="Fail above this largest |throughput error|.")] = 0.08,
    max_tpot_median_error: Annotated[float, typer.Option(help="Fail above this median |TPOT p50 error|.")] = 0.05,
    json_out: JsonOut = None,
) -> None:
    """Run the simulator on every cell of a live-results file and print its error per cell, median and max."""
    check_output(json_out, "--json")
    df = _read_live(live)
    configs = _cell_configs(df, live, profile)
    err_console = Console(stderr=True)
    rows = _simulate_cells(df, configs, err_console)
    t = Table(title=f"simulator vs live: {live}", title_justify="left")
    for col in ("cell", "live tok/s", "sim tok/s", "error", "live TPOT p50", "sim TPOT p50", "error "):
        t.add_column(col, justify="left" if col == "cell" else "right")
    for r in rows:
        t.add_row(str(r["cell"]), f"{r['live_throughput']:,.1f}", f"{r['sim_throughput']:,.1f}",
                  f"{r['err_throughput']:+.1%}", f"{r['live_tpot_p50']:.2f}", f"{r['sim_tpot_p50']:.2f}",
                  f"{r['err_tpot_p50']:+.1%}")  # fmt: skip
    med, worst = _summary([r["err_throughput"] for r in rows])
    tmed, tworst = _summary([r["err_tpot_p50"] for r in rows])
    if json_out != "-":
        Console().print(t)
    summary = {"cells": len(rows), "throughput_median_abs_error": med, "throughput_max_abs_error": worst,
               "tpot_p50_median_abs_error": tmed, "tpot_p50_max_abs_error": tworst}  # fmt: skip
    if json_out:
        text = json.dumps({"summary": summary, "cells": rows}, indent=1, default=float)
        print(text) if json_out == "-" else Path(json_out).write_text(text + "\n")
    ok = med <= max_median_error and worst <= max_error and tmed <= max_tpot_median_error
    verdict = "within" if ok else "OUTSIDE"
    limits = f"{max_median_error:.0%} / {max_error:.0%} / {max_tpot_median_error:.0%}"
    line = (f"throughput |error|: median {med:.1%}, max {worst:.1%}; TPOT p50 |error|: median {tmed:.1%}, max "
            f"{tworst:.1%} ({verdict} {limits})")  # fmt: skip
    (Console() if json_out != "-" else err_console).print(line)
    if not ok:
        raise SystemExit(1)


def _read_live(live: Path) -> Any:
    """The live-results CSV as a DataFrame, refused (one line naming the file and line) when a column is missing
    or a measured metric is not a positive number: a bad row would otherwise show up as a huge error."""
    import pandas as pd  # here, not at the top: loading the command stays free of pandas

    try:
        df = pd.read_csv(live)
    except (OSError, ValueError) as e:
        raise CliError(f"{live}: cannot read the live results ({e})") from None
    missing = [c for c in ("args", *METRICS.values()) if c not in df.columns]
    if missing:
        raise CliError(f"{live}: missing column(s) {', '.join(missing)} (args + the live metrics of each cell)")
    for key in METRICS.values():
        for i, raw in enumerate(df[key]):
            if pd.isna(raw):
                continue  # not measured: left out of the summary
            try:
                v = float(raw)
            except (TypeError, ValueError):
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise CliError(f"{live}: line {i + 2}: {key} must be a number > 0 (or empty), got {raw!r}")
    return df


def _cell_configs(df: Any, live: Path, profile: str | None) -> list[tuple[SimConfig, bool]]:
    """Each cell's SimConfig and 'auto' flag, every one checked as a run would check it before any runs: a bad
    cell stops the command before minutes of simulating the good ones."""
    base = live.resolve().parent
    configs = []
    for i, a in enumerate(df["args"]):
        try:
            cfg, auto = cell_config(str(a), base, profile)
            prepare_sim(cfg)
        except USAGE_ERRORS as e:
            raise CliError(f"{live}: line {i + 2}: {e.format_message()}") from None
        except ValueError as e:
            raise CliError(f"{live}: line {i + 2}: {e}") from None
        configs.append((cfg, auto))
    return configs


def _simulate_cells(df: Any, configs: list[tuple[SimConfig, bool]], err_console: Console) -> list[dict[str, Any]]:
    """Simulate every cell (a progress bar on stderr): per cell its live and simulated metrics and their error."""
    rows: list[dict[str, Any]] = []
    with progress_bar(err_console, *counted("validate")) as bar:
        task = bar.add_task("cells", total=len(df))
        for (_, rec), (cfg, auto) in zip(df.iterrows(), configs, strict=True):
            s = simulate(cfg, auto).summary
            row: dict[str, Any] = {"cell": rec.get("cell", rec["args"]), "args": rec["args"]}
            for name, key in METRICS.items():
                row[f"live_{name}"] = float(rec[key])
                row[f"sim_{name}"] = float(s.get(key, float("nan")))
                row[f"err_{name}"] = _err(row[f"sim_{name}"], row[f"live_{name}"])
            rows.append(row)
            bar.advance(task)
    return rows
