"""`trsim sweep`: run a grid of simulations (any axis given as a comma list) to CSV + PNG.

Every simulation flag of `trsim run` is an axis here, except the ones that name files or shapes of the
scheduler (trace, config, page and batch sizes).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenrouter.cli.common import parse_list
from tokenrouter.cli.report import result_record
from tokenrouter.cli.run_cmd import sim_config_from_flags, simulate


def _opt_int(t: str) -> int | None:
    return None if t.lower() == "none" else int(t)


def _opt_float(t: str) -> float | None:
    return None if t.lower() == "none" else float(t)


def _on_off(t: str) -> bool:
    if t.lower() not in ("on", "off"):
        raise ValueError(t)
    return t.lower() == "on"


# axis name -> (converter, list separator). Thresholds are lists themselves, so they split on ';'.
AXES: dict[str, tuple[Any, str]] = {
    "hop_rate": (float, ","),
    "concurrency": (int, ","),
    "policy": (str, ","),
    "thresholds": (str, ";"),
    "placement": (str, ","),
    "workload": (str, ","),
    "router": (str, ","),
    "small": (str, ","),
    "large": (str, ","),
    "seed": (int, ","),
    "return_prob": (float, ","),
    "num_requests": (int, ","),
    "max_output": (_opt_int, ","),
    "arrival_rate": (_opt_float, ","),
    "graphs": (_on_off, ","),
    "overlap": (_on_off, ","),
    "profile": (str, ","),
}


def _axis(name: str, text: str) -> list[Any]:
    conv, sep = AXES[name]
    if sep == ";":
        return [t.strip() for t in text.split(";") if t.strip()] or ["auto"]
    items = parse_list(text, conv, f"--{name.replace('_', '-')}")
    if name == "workload":  # fixed:P,O carries its own comma: glue the output length back on
        glued: list[Any] = []
        for it in items:
            if glued and it.isdigit() and str(glued[-1]).startswith("fixed:") and "," not in glued[-1]:
                glued[-1] = f"{glued[-1]},{it}"
            else:
                glued.append(it)
        items = glued
    return items


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        out: Annotated[Path, typer.Option("--out", "-o", help="CSV file (one row per run).")] = Path("sweep.csv"),
        plot: Annotated[Path | None, typer.Option(help="PNG of throughput over the first numeric axis.")] = None,
        hop_rate: Annotated[str, typer.Option("--hop-rate", "-p", help="e.g. 0.05,0.1,0.2")] = "0.1",
        concurrency: Annotated[str, typer.Option("--concurrency", "-n", help="e.g. 1,4,8,16")] = "8",
        policy: Annotated[str, typer.Option(help="e.g. eager,delayed,std-serving")] = "delayed",
        thresholds: Annotated[str, typer.Option(help="';'-separated: 'auto;1,1;1,3'")] = "auto",
        placement: Annotated[str, typer.Option(help="e.g. mps,separate")] = "mps",
        workload: Annotated[str, typer.Option(help="e.g. low-effort,high-effort")] = "low-effort",
        router: Annotated[str, typer.Option(help="e.g. r2r,r-stitch")] = "r2r",
        small: Annotated[str, typer.Option(help="Small models")] = "qwen3-0.6b",
        large: Annotated[str, typer.Option(help="Large models")] = "qwen3-32b",
        seed: Annotated[str, typer.Option(help="Seeds, e.g. 0,1,2")] = "0",
        return_prob: Annotated[str, typer.Option(help="r-stitch return probabilities")] = "1.0",
        num_requests: Annotated[str, typer.Option(help="Requests per run, e.g. 64,256")] = "64",
        profile: Annotated[str, typer.Option(help="Profile names or files.")] = "h200",
        max_output: Annotated[str, typer.Option(help="Output caps, e.g. none,2048,8192")] = "none",
        arrival_rate: Annotated[str, typer.Option(help="Open-loop rates (req/s) or none (closed loop)")] = "none",
        graphs: Annotated[str, typer.Option(help="CUDA graphs: on,off")] = "on",
        overlap: Annotated[str, typer.Option(help="CPU-GPU overlap: on,off")] = "on",
    ) -> None:
        """Run every combination of the list-valued flags; write one CSV row per run (and a plot)."""
        given = {
            "hop_rate": hop_rate,
            "concurrency": concurrency,
            "policy": policy,
            "thresholds": thresholds,
            "placement": placement,
            "workload": workload,
            "router": router,
            "small": small,
            "large": large,
            "seed": seed,
            "return_prob": return_prob,
            "num_requests": num_requests,
            "max_output": max_output,
            "arrival_rate": arrival_rate,
            "graphs": graphs,
            "overlap": overlap,
            "profile": profile,
        }
        axes = {k: _axis(k, v) for k, v in given.items()}
        grid = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
        # Validate every point before spending minutes on the first ones.
        configs = [sim_config_from_flags(**p) for p in grid]  # axis names are run's flag names
        rows = []
        console = Console(stderr=True)
        cols = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*cols, console=console, transient=False) as bar:
            task = bar.add_task("sweep", total=len(grid))
            for point, (cfg, auto) in zip(grid, configs, strict=True):
                res = simulate(cfg, auto)
                rows.append({**{f"arg_{k}": v for k, v in point.items()}, **result_record(res)})
                bar.advance(task)
        import pandas as pd

        df = pd.DataFrame(rows)
        df.to_csv(out, index=False)
        varying = [k for k, v in axes.items() if len(v) > 1]
        console.print(f"wrote {len(df)} rows to {out}")
        if plot:
            from tokenrouter.plots import plot_sweep

            numeric = [k for k in varying if AXES[k][0] in (int, float)]
            x = numeric[0] if numeric else (varying[0] if varying else "concurrency")
            hue = next((k for k in varying if k != x), None)
            y = (
                "steady_output_throughput_tok_s"
                if df.get("steady_output_throughput_tok_s") is not None
                else ("output_throughput_tok_s")
            )
            plot_sweep(df, f"arg_{x}", y, f"arg_{hue}" if hue else None, plot, title=f"trsim sweep: {y}")
            console.print(f"wrote {plot}")
