"""`trsim tune`: choose delayed-batching thresholds per concurrency and write a deployment config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.calibration.gpus import load_gpu_prices
from tokenrouter.cli.common import CliError, check_output, note_cpu_profile, parse_list, parse_sm_splits
from tokenrouter.cli.options import (
    DeploymentFlags,
    DryRun,
    GpuPrices,
    Jobs,
    MaxOutput,
    SearchBudget,
    Seed,
    SloTpot,
    Workload,
    deployment_flags,
)
from tokenrouter.cli.progress import counted, progress_bar
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, TuneObjective, parse_name
from tokenrouter.core.policy import format_b
from tokenrouter.sim.decide import DEFAULT_BUDGET_S, Objective
from tokenrouter.sim.propose import check_search_concurrency
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.tune import Candidate, at_sustained_load
from tokenrouter.sim.tune_layouts import (
    candidate_prices,
    candidate_specs,
    comparison_rule,
    parse_placement,
    points_to_tune,
    tune_and_choose,
    tuned_config,
)

Out = Annotated[Path, typer.Option("--out", "-o", help="Deployment YAML to write.")]
TuneConcurrency = Annotated[str, typer.Option("--concurrency", "-n", help="Concurrencies to tune, e.g. 1,2,4,8,16; "
                            "N > 1024 is refused. Between two tuned N the served B is interpolated "
                            "(docs/config.md).")]  # fmt: skip
TuneRequests = Annotated[int, typer.Option(help="Requests per simulated trial of a B (default 3N, >= 24; a trial "
                         "stops when the closed loop runs out of them).")]  # fmt: skip
Top = Annotated[int, typer.Option(help="Markov proposals that start the simulator's search per N.")]
SmSplits = Annotated[str | None, typer.Option(help="Also choose the MPS SM split, SMALL/LARGE percent, among these "
                     "(e.g. 100/100,40/60): the one whose tuned B simulates fastest at --compare-n is written. Needs "
                     "a profile that measured the pair at each split.")]  # fmt: skip
Placements = Annotated[str | None, typer.Option(help="Also choose where the models run, among these layouts on "
                       "--num-gpus GPUs: mps (both on GPU 0 under MPS; 1 GPU), separate (small on GPU 0, large on GPU "
                       "1; 2 GPUs), tp (the large model tensor-parallel over all G GPUs, the small one beside it on "
                       "GPU 0 under MPS; G GPUs), SMALL+LARGE GPU kinds such as l4+h200 (each model on a GPU of its "
                       "kind, two hosts over the cross-host link; a kind other than the profile's is priced from its "
                       "ESTIMATED profile). Each is tuned with its own B and compared by --objective (total: at "
                       "--compare-n; per-gpu and cost: at the highest N it sustains within --slo-tpot-ms); the best "
                       "is tuned at every N and written.")]  # fmt: skip
NumGpus = Annotated[int, typer.Option(help="GPUs the --placements layouts may use (G).")]
ObjectiveName = Annotated[str, typer.Option(help="What --placements optimises: total (tok/s at --compare-n), per-gpu "
                          "(tok/s per GPU used) or cost (least USD per million output tokens; needs --gpu-prices). "
                          "per-gpu and cost compare each candidate at the highest N of --concurrency it sustains with "
                          "TPOT p99 <= --slo-tpot-ms (tuned upward until its first miss; one that meets it at no N "
                          "ranks last), so a placement on more GPUs is not priced at a load that leaves them idle; "
                          "without --slo-tpot-ms, at the largest N.")]  # fmt: skip
CompareN = Annotated[int | None, typer.Option("--compare-n", "--split-n", help="Concurrency at which SM splits and "
                     "placements are compared by --objective total (one of --concurrency; default 8 if tuned, else the "
                     "largest). per-gpu and cost compare each at the load it sustains instead.")]  # fmt: skip


@deployment_flags()
def tune(deploy: DeploymentFlags, out: Out = Path("serve.yaml"), concurrency: TuneConcurrency = "1,2,4,8,16",
         workload: Workload = "low-effort", num_requests: TuneRequests = 0, top: Top = 3, seed: Seed = 0,
         max_output: MaxOutput = None, sm_splits: SmSplits = None, placements: Placements = None, num_gpus: NumGpus = 2,
         objective: ObjectiveName = "total", gpu_prices: GpuPrices = None, compare_n: CompareN = None,
         slo_tpot_ms: SloTpot = None, search_budget: SearchBudget = DEFAULT_BUDGET_S, jobs: Jobs = 0,
         dry_run: DryRun = False) -> None:  # fmt: skip
    """For each N the decider chooses B (the Markov model proposes, the simulator ranks: docs/simulator.md); the
    chosen B goes into the config's B(N) table, which `tr serve --config` follows as live concurrency changes.
    The deployment tuned is `--config` (or the default pair) with the flags applied; its policy becomes
    delayed. With --placements and/or --sm-splits, each candidate is tuned where --objective compares it
    (docs/cli.md), and the best one is tuned at every N and written."""
    if not dry_run:
        check_output(out, "--out")
    ns, ref_n = _concurrencies(concurrency, compare_n)
    goal, prices = _objective(objective, gpu_prices, compare_n)
    if top < 1:
        raise CliError(f"--top must be >= 1 (Markov proposals simulated per N), got {top}")
    if search_budget <= 0:
        raise CliError(f"--search-budget must be > 0 seconds, got {search_budget}")
    target = Objective(slo_tpot_ms)  # which B is best at each N (--objective chooses among placements)
    layouts = _layouts(placements, deploy)
    # the tune starts delayed, from no thresholds given (B is what it chooses)
    ov = dataclasses.replace(deploy.overrides, policy="delayed", thresholds=None)
    base = dataclasses.replace(deploy, overrides=ov).resolve()
    if dry_run:
        typer.echo(base.to_yaml().rstrip())
        return
    note_cpu_profile("trsim tune", base.profile)
    splits = parse_sm_splits(sm_splits) if sm_splits else [None]
    specs = candidate_specs(layouts, splits, base, num_gpus)
    usd = candidate_prices(base, specs, prices)
    sweep = at_sustained_load(goal) and slo_tpot_ms is not None and len(specs) > 1
    cols = counted("tune {task.fields[what]} N={task.fields[n]}")
    with sim_pool(jobs) as pool, progress_bar(Console(stderr=True), *cols) as bar:
        # sweeping placements upward stops at each one's first SLO miss: the total is then an upper bound
        task = bar.add_task("tune", total=points_to_tune(len(specs), len(ns), sweep), n=ns[0], what="")
        progress = lambda label, n, done: bar.update(task, n=n, what=label, advance=done)  # noqa: E731
        best, candidates = tune_and_choose(base, specs, ns, ref_n, goal, usd=usd, progress=progress, pool=pool,
                                           workload=workload, num_requests=num_requests, top=top, seed=seed,
                                           max_output=max_output, target=target,
                                           budget_s=search_budget)  # fmt: skip
    if len(candidates) > 1:
        _print_candidates(candidates, best, ref_n, goal)
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


def _objective(objective: str, gpu_prices: str | None,
               compare_n: int | None) -> tuple[TuneObjective, dict[str, float] | None]:  # fmt: skip
    """--objective and the --gpu-prices it may need (USD per GPU-hour by kind); --compare-n only where it is used."""
    goal = parse_name(TuneObjective, objective, "--objective")
    if compare_n is not None and at_sustained_load(goal):
        raise CliError(f"--compare-n applies to --objective total: {goal} compares each candidate at the highest N "
                       "of --concurrency it sustains within --slo-tpot-ms (the largest N without it)")  # fmt: skip
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
    """The tuned B per N beside the Markov model's proposal and eager, and what limited a search."""
    names = " + ".join(m.name for m in dep.models)
    t = Table(title=f"trsim tune: {names}, {dep.router.name} hop rate {dep.router.hop_rate}, "
              f"{best.label}, {workload}{', ESTIMATED (below)' if best.estimated else ''}")  # fmt: skip
    cols = ("N", "Markov B*", "Markov tok/s", "sim tok/s @B*", "chosen B", "sim tok/s", "TPOT p99 ms",
            "B scouted")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")
    slo = best.points[0].choice.objective.slo_tpot_ms if best.points else None
    for p in best.points:
        mb, mtok = p.markov
        at_mb = p.simulated.get(mb) if mb is not None else None
        chosen = format_b(p.best) + ("" if p.meets_slo else " (SLO missed)")
        t.add_row(str(p.concurrency), format_b(mb), "-" if mtok != mtok else f"{mtok:,.0f}",
                  "-" if at_mb is None else f"{at_mb:,.0f}", chosen, f"{p.best_throughput:,.0f}",
                  f"{p.tpot_ms[1]:.2f}", str(len(p.choice.scouted)))  # fmt: skip
    notes = [f"B of highest simulated steady tok/s whose TPOT p99 <= {slo:g} ms"] if slo is not None else []
    if any(p.markov[1] != p.markov[1] for p in best.points):  # nan: no prediction
        notes.append("Markov tok/s -: the chain of its B* does not fit the proposal budget at that N")
    t.caption = "; ".join(notes) or None
    Console().print(t)
    for p in best.points:
        if p.choice.note:
            Console().print(f"N={p.concurrency}: {p.choice.note}")
        if not p.meets_slo:
            Console().print(f"[yellow]N={p.concurrency}: {p.choice.describe()}; written: the B of lowest TPOT[/yellow]")


def _print_candidates(candidates: list[Candidate], best: Candidate, compare_n: int, goal: TuneObjective) -> None:
    """The candidates table, and a line when none met the SLO at any N (the one written is then the closest)."""
    sustained = at_sustained_load(goal)
    Console().print(candidates_table(candidates, best, None if sustained else compare_n, goal))
    if sustained and best.sustained_n is None and best.slo_tpot_ms is not None:
        Console().print(f"[yellow]no candidate meets TPOT p99 <= {best.slo_tpot_ms:g} ms at any N: written the one of "
                        f"lowest TPOT p99 at N={best.first_n}, {best.label}[/yellow]")  # fmt: skip


def candidates_table(candidates: list[Candidate], best: Candidate, n: int | None, goal: TuneObjective) -> Table:
    """Each candidate at the N it was compared at (`n`; None: its sustained N, the "priced at N" column), numbers
    resting on an estimate marked * ESTIMATED; one that meets the SLO at no N shown at its smallest N, marked."""
    slo = best.slo_tpot_ms
    ns = sorted({p.concurrency for c in candidates for p in c.points})
    t = Table(title=f"candidates {comparison_rule(n, slo, ns)}; each with its own tuned B; chosen by {goal}")
    priced = any(c.usd_per_hour is not None for c in candidates)
    cols = ("candidate", "GPUs", "GPU ids", *(("priced at N",) if n is None else ()), "B", "sim tok/s", "per GPU",
            *(("USD/Mtok",) if priced else ()), "TPOT p50 ms", "TPOT p99 ms", "Markov tok/s", "")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("candidate", "GPU ids", "") else "right")
    t.columns[-1].min_width = len("ESTIMATED")  # a narrow terminal wraps the numbers' headers before this word
    for c in candidates:
        # GPU ids per model in model order, e.g. "0 + 0,1 tp2": the small on GPU 0, the large over 0 and 1 (GPU kinds
        # are in the label: "l4+h200" puts each on GPU 0 of its own host)
        where = " + ".join(",".join(map(str, m.gpus)) + (f" tp{m.tp}" if m.tp > 1 else "") for m in c.deployment.models)
        at = c.priced_n(n)
        shown = c.first_n if at is None else at  # meets the SLO at no N: its numbers at the smallest N
        p, est = c.point(shown), "*" if c.estimated else ""
        usd = c.usd_per_mtok(shown)
        cost = ([f"{usd:,.3f}"] if usd is not None else ["-"]) if priced else []
        nums = [f"{c.throughput(shown):,.0f}", f"{c.per_gpu(shown):,.0f}", *cost, f"{p.tpot_ms[0]:.2f}",
                f"{p.tpot_ms[1]:.2f}", "-" if p.markov[0] is None else f"{p.markov[1]:,.0f}"]  # fmt: skip
        missed = "" if p.meets_slo else f"SLO missed at N={shown}" + (", ranked last" if at is None else "")
        mark = ", ".join(x for x in ("chosen" if c is best else "", missed, "ESTIMATED" if c.estimated else "") if x)
        at_col = [str(at) if at is not None else "-"] if n is None else []
        t.add_row(c.label, str(c.gpus), where, *at_col, format_b(p.best), *(x + est for x in nums), mark)
    notes = [f"TPOT SLO: p99 <= {slo:g} ms" if slo is not None else "no TPOT SLO (--slo-tpot-ms)"]
    if any(c.estimated for c in candidates):
        notes.append("* ESTIMATED: rests on the estimates listed below")
    t.caption = "; ".join(notes)
    return t
