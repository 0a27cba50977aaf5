"""`trsim sweep`: a grid of simulations (every deployment and run flag of `trsim run` is an axis) to CSV + PNG."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tokenrouter.cli.common import check_output, note_cpu_profile, parse_list
from tokenrouter.cli.options import DeploymentFlags, deployment_flags, point_flags
from tokenrouter.cli.progress import counted, progress_bar
from tokenrouter.cli.report import result_record
from tokenrouter.sim.run import prepare_sim
from tokenrouter.sim.simulate import sim_config, simulate


def _or_none(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """`conv`, with 'none' read as None (no output cap, a closed loop)."""
    return lambda t: None if t.lower() == "none" else conv(t)


# Run axes (the deployment axes come from the shared deployment flags): name -> converter.
RUN_AXES: dict[str, Any] = {"concurrency": int, "workload": str, "seed": int, "num_requests": int,
                            "max_output": _or_none(int), "arrival_rate": _or_none(float)}  # fmt: skip
NUMERIC = {"hop_rate", "return_prob", "concurrency", "seed", "num_requests", "max_output", "arrival_rate",
           "page_size", "max_batch_size", "max_batch_tokens"}  # fmt: skip


def _run_axis(name: str, text: str) -> list[Any]:
    items = parse_list(text, RUN_AXES[name], f"--{name.replace('_', '-')}")
    if name == "workload":  # fixed:P,O carries its own comma: glue the output length back on
        glued: list[Any] = []
        for it in items:
            if glued and it.isdigit() and str(glued[-1]).startswith("fixed:") and "," not in glued[-1]:
                glued[-1] = f"{glued[-1]},{it}"
            else:
                glued.append(it)
        items = glued
    return items


DryRun = Annotated[bool, typer.Option("--dry-run", help="Print each grid point's deployment (YAML documents) and "
                   "exit.")]  # fmt: skip


@deployment_flags(axes=True)
def sweep(
    deploy: DeploymentFlags,
    out: Annotated[Path, typer.Option("--out", "-o", help="CSV file (one row per run).")] = Path("sweep.csv"),
    plot: Annotated[Path | None, typer.Option(help="PNG of throughput over the first numeric axis.")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", "-n", help="Clients N, e.g. 1,4,8,16")] = "8",
    workload: Annotated[str, typer.Option(help="Workloads, e.g. low-effort,fixed:100,200")] = "low-effort",
    seed: Annotated[str, typer.Option(help="Seeds, e.g. 0,1,2")] = "0",
    num_requests: Annotated[str, typer.Option(help="Requests per run, e.g. 64,256")] = "64",
    max_output: Annotated[str, typer.Option(help="Output caps, e.g. none,2048,8192")] = "none",
    arrival_rate: Annotated[str, typer.Option(help="Open-loop rates (req/s) or none (closed loop)")] = "none",
    dry_run: DryRun = False,
) -> None:
    """Run every combination of the list-valued flags; write one CSV row per run (and a plot).

    Every deployment flag is an axis (comma list; `;` between values of per-model lists such as
    --thresholds '1,1;1,7'); flags not given keep the config's (or the default deployment's) value."""
    if not dry_run:
        check_output(out, "--out")
        check_output(plot, "--plot", figure=True)
    axes_in: dict[str, Any] = dict(deploy)  # type: ignore[call-overload]
    config = axes_in.pop("config")
    run_given = {"concurrency": concurrency, "workload": workload, "seed": seed, "num_requests": num_requests,
                 "max_output": max_output, "arrival_rate": arrival_rate}  # fmt: skip
    axes: dict[str, list[Any]] = {k: _run_axis(k, v) for k, v in run_given.items()}
    axes.update(axes_in)
    grid = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    # Validate every point before spending minutes on the first ones.
    configs = []
    for point in grid:
        dep_point = {k: v for k, v in point.items() if k not in RUN_AXES}
        run_point = {k: v for k, v in point.items() if k in RUN_AXES}
        flags = point_flags(config, dep_point)
        cfg, auto = sim_config(flags.resolve(), flags.b_choice, **run_point)
        if not dry_run:
            prepare_sim(cfg)  # profile, models, workload, seed, router: whatever a run would refuse
        configs.append((cfg, auto))
    if dry_run:
        typer.echo("\n---\n".join(c.deployment.to_yaml().rstrip() for c, _ in configs))
        return
    for name in dict.fromkeys(c.deployment.profile for c, _ in configs):
        note_cpu_profile("trsim sweep", name)
    rows = []
    console = Console(stderr=True)
    with progress_bar(console, *counted("sweep")) as bar:
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

        numeric = [k for k in varying if k in NUMERIC]
        x = numeric[0] if numeric else (varying[0] if varying else "concurrency")
        hue = next((k for k in varying if k != x), None)
        steady = "steady_output_throughput_tok_s"
        y = steady if steady in df else "output_throughput_tok_s"
        plot_sweep(df, f"arg_{x}", y, f"arg_{hue}" if hue else None, plot, title=f"trsim sweep: {y}")
        console.print(f"wrote {plot}")
