"""`trsim tune`: choose delayed-batching thresholds per concurrency and write a deployment config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenrouter.calibration.gpus import load_gpu_prices
from tokenrouter.cli.common import CliError, check_output, note_cpu_profile, parse_list, parse_sm_splits
from tokenrouter.cli.options import (
    DeploymentFlags,
    DryRun,
    GpuPrices,
    Jobs,
    MaxOutput,
    Seed,
    Workload,
    deployment_flags,
)
from tokenrouter.cli.progress import progress_bar
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, TuneObjective, parse_name
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.tune import Candidate, check_search_concurrency
from tokenrouter.sim.tune_layouts import (
    candidate_prices,
    candidate_specs,
    parse_placement,
    points_to_tune,
    tune_and_choose,
    tuned_config,
    tuning_flags,
)

CONCURRENCY_HELP = (
    "Concurrencies to tune, e.g. 1,2,4,8,16. The Markov search is exact up to about N = 8; larger N runs a reduced "
    "search (coarser quantum, threshold grid, or B scaled from N/2) and says so; N > 1024 is refused."
)


@deployment_flags()
def tune(
    deploy: DeploymentFlags,
    out: Annotated[Path, typer.Option("--out", "-o", help="Deployment YAML to write.")] = Path("serve.yaml"),
    concurrency: Annotated[str, typer.Option("--concurrency", "-n", help=CONCURRENCY_HELP)] = "1,2,4,8,16",
    workload: Workload = "low-effort",
    num_requests: Annotated[int, typer.Option(help="Requests per simulator check (default 4N, >= 32).")] = 0,
    top: Annotated[int, typer.Option(help="Markov candidates checked in the simulator per N.")] = 3,
    seed: Seed = 0,
    max_output: MaxOutput = None,
    sm_splits: Annotated[
        str | None,
        typer.Option(
            help="Also choose the MPS SM split, SMALL/LARGE percent, among these (e.g. 100/100,40/60): "
            "the one whose tuned B simulates fastest at --compare-n is written. Needs a profile that "
            "measured the pair at each split."
        ),
    ] = None,
    placements: Annotated[
        str | None,
        typer.Option(
            help="Also choose where the models run, among these layouts on --num-gpus GPUs: mps (both on "
            "GPU 0 under MPS; 1 GPU), separate (small on GPU 0, large on GPU 1; 2 GPUs), tp (the large "
            "model tensor-parallel over all G GPUs, the small one beside it on GPU 0 under MPS; G GPUs), "
            "SMALL+LARGE GPU kinds such as l4+h200 (each model on a GPU of its kind, two hosts over the cross-host "
            "link; a kind other than the profile's is priced from its ESTIMATED profile). "
            "Each is tuned with its own B at --compare-n; the best by --objective there is tuned at every N "
            "and written."
        ),
    ] = None,
    num_gpus: Annotated[int, typer.Option(help="GPUs the --placements layouts may use (G).")] = 2,
    objective: Annotated[
        str,
        typer.Option(
            help="What --placements optimises: total (tok/s), per-gpu (tok/s per GPU used) or cost "
            "(least USD per million output tokens; needs --gpu-prices)."
        ),
    ] = "total",
    gpu_prices: GpuPrices = None,
    compare_n: Annotated[
        int | None,
        typer.Option(
            "--compare-n",
            "--split-n",
            help="Concurrency at which SM splits and placements are "
            "compared (one of --concurrency; default 8 if tuned, else the largest).",
        ),
    ] = None,
    jobs: Jobs = 0,
    dry_run: DryRun = False,
) -> None:
    """For each N: B* from the Markov model, the top candidates checked in the simulator; the measured best
    goes into the config's B(N) table, which `tr serve --config` follows as live concurrency changes.
    The deployment tuned is `--config` (or the default pair) with the flags applied; its policy becomes
    delayed. With --placements and/or --sm-splits, each candidate deployment is tuned this way at --compare-n,
    and the best one there is tuned at every N and written."""
    if not dry_run:
        check_output(out, "--out")
    ns, ref_n = _concurrencies(concurrency, compare_n)
    if top < 1:
        raise CliError(f"--top must be >= 1 (Markov candidates simulated per N), got {top}")
    goal, prices = _objective(objective, gpu_prices)
    layouts = _layouts(placements, deploy)
    deploy = tuning_flags(deploy)
    if dry_run:
        typer.echo(deploy.resolve().to_yaml().rstrip())
        return
    note_cpu_profile("trsim tune", deploy.resolve().profile)
    splits = parse_sm_splits(sm_splits) if sm_splits else [None]
    specs = candidate_specs(layouts, splits, deploy.resolve(), num_gpus)
    usd = candidate_prices(deploy, specs, prices)
    cols = (TextColumn("tune {task.fields[what]} N={task.fields[n]}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())  # fmt: skip
    with sim_pool(jobs) as pool, progress_bar(Console(stderr=True), *cols) as bar:
        task = bar.add_task("tune", total=points_to_tune(len(specs), len(ns)), n=ns[0], what="")
        progress = lambda label, n, done: bar.update(task, n=n, what=label, advance=done)  # noqa: E731
        best, candidates = tune_and_choose(deploy, specs, ns, ref_n, goal, usd=usd, progress=progress, pool=pool,
                                           workload=workload, num_requests=num_requests, top=top, seed=seed,
                                           max_output=max_output)  # fmt: skip
    if len(candidates) > 1:
        Console().print(_candidates_table(candidates, best, ref_n, goal))
    dep = tuned_config(best, candidates, ref_n, goal, workload=workload, num_gpus=num_gpus,
                       placements=bool(placements), splits=bool(sm_splits))  # fmt: skip
    dep.save(out)
    _print_points(dep, best, workload)
    for note in dict.fromkeys(n for c in candidates for n in c.estimated):
        Console().print(f"[yellow]{note}[/yellow]")
    Console().print(f"wrote {out}")


def _concurrencies(concurrency: str, compare_n: int | None) -> tuple[list[int], int]:
    """The N to tune, in order, and the one candidates are compared at; checked before any N is tuned."""
    ns = sorted(set(parse_list(concurrency, int, "--concurrency")))
    if ns[0] < 1:
        raise ValueError("--concurrency values must be >= 1")
    check_search_concurrency(ns[-1])
    ref_n = compare_n if compare_n is not None else (8 if 8 in ns else ns[-1])
    if ref_n not in ns:
        raise CliError(f"--compare-n {ref_n} must be one of --concurrency {concurrency}")
    return ns, ref_n


def _objective(objective: str, gpu_prices: str | None) -> tuple[TuneObjective, dict[str, float] | None]:
    """--objective and the --gpu-prices it may need (USD per GPU-hour by kind)."""
    goal = parse_name(TuneObjective, objective, "--objective")
    prices = load_gpu_prices(gpu_prices) if gpu_prices else None
    if goal is TuneObjective.COST and prices is None:
        raise CliError("--objective cost needs --gpu-prices (USD per GPU-hour by kind)")
    return goal, prices


def _layouts(placements: str | None, deploy: DeploymentFlags) -> list[Layout | tuple[str, str] | None]:
    """The --placements items (None: the flags' placement alone)."""
    if not placements:
        return [None]
    given = [f for f in ("placement", "gpus", "tp") if getattr(deploy.overrides, f) is not None]
    if given:
        raise CliError(f"--placements sets placement, GPUs and tp per layout: leave out --{given[0]} (the "
                       "number of GPUs is --num-gpus)")  # fmt: skip
    return [parse_placement(x) for x in parse_list(placements, str, "--placements")]


def _print_points(dep: DeploymentConfig, best: Candidate, workload: str) -> None:
    """The tuned B per N beside the Markov model's B* and eager, and the Markov model's notes."""
    names = " + ".join(m.name for m in dep.models)
    t = Table(title=f"trsim tune: {names}, {dep.router.name} hop rate {dep.router.hop_rate}, "
              f"{best.label}, {workload}{', ESTIMATED (below)' if best.estimated else ''}")  # fmt: skip
    for col in ("N", "Markov B*", "Markov tok/s", "sim tok/s @B*", "chosen B", "sim tok/s", "eager tok/s"):
        t.add_column(col, justify="right")
    eager = (1,) * len(dep.models)
    for p in best.points:
        t.add_row(
            str(p.concurrency),
            _b(p.prediction.thresholds),
            f"{p.prediction.throughput:,.0f}",
            f"{p.simulated[p.prediction.thresholds]:,.0f}",
            _b(p.best),
            f"{p.best_throughput:,.0f}",
            f"{p.simulated.get(eager, float('nan')):,.0f}",
        )
    Console().print(t)
    for p in best.points:
        if p.prediction.note:
            Console().print(f"N={p.concurrency}: {p.prediction.note}")


def _candidates_table(candidates: list[Candidate], best: Candidate, n: int, goal: TuneObjective) -> Table:
    """Each candidate at N: tok/s, per GPU, USD per million output tokens (with prices), TPOT, the chosen B; each
    number resting on an estimate is marked * ESTIMATED (what was estimated is printed below the tables)."""
    t = Table(title=f"candidates at N={n}, each with its own tuned B; chosen by {goal}")
    priced = any(c.usd_per_hour is not None for c in candidates)
    cols = ("candidate", "GPUs", "GPU ids", "B", "sim tok/s", "per GPU", *(("USD/Mtok",) if priced else ()),
            "TPOT p50 ms", "TPOT p99 ms", "Markov tok/s", "")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("candidate", "GPU ids", "") else "right")
    t.columns[-1].min_width = len("ESTIMATED")  # a narrow terminal wraps the numbers' headers before this word
    for c in candidates:
        # GPU ids per model in model order, e.g. "0 + 0,1 tp2": the small on GPU 0, the large over 0 and 1 (GPU kinds
        # are in the label: "l4+h200" puts each on GPU 0 of its own host)
        where = " + ".join(",".join(map(str, m.gpus)) + (f" tp{m.tp}" if m.tp > 1 else "") for m in c.deployment.models)
        p, est = c.point(n), "*" if c.estimated else ""
        usd = c.usd_per_mtok(n)
        cost = ([f"{usd:,.3f}"] if usd is not None else ["-"]) if priced else []
        nums = [f"{c.throughput(n):,.0f}", f"{c.per_gpu(n):,.0f}", *cost, f"{p.tpot_ms[0]:.2f}",
                f"{p.tpot_ms[1]:.2f}", f"{p.prediction.throughput:,.0f}"]  # fmt: skip
        mark = ", ".join(x for x in ("chosen" if c is best else "", "ESTIMATED" if c.estimated else "") if x)
        t.add_row(c.label, str(c.gpus), where, _b(p.best), *(x + est for x in nums), mark)
    if any(c.estimated for c in candidates):
        t.caption = "* ESTIMATED: rests on the estimates listed below"
    return t


def _b(b: tuple[int, ...]) -> str:
    return ",".join(map(str, b))
