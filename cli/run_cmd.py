"""`trsim run`: simulate one deployment under one workload."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tokenrouter.cli.common import CliError, check_output, note_cpu_profile
from tokenrouter.cli.options import (
    ArrivalRate,
    Concurrency,
    DeploymentFlags,
    DryRun,
    Jobs,
    MaxOutput,
    NumRequests,
    SearchBudget,
    Seed,
    SloTpot,
    TraceWorkload,
    check_run_flags,
    deployment_flags,
)
from tokenrouter.cli.progress import Heartbeat
from tokenrouter.cli.report import print_result, result_record, run_end, write_json
from tokenrouter.core.policy import format_b
from tokenrouter.sim.decide import DEFAULT_BUDGET_S, Objective, Trial
from tokenrouter.sim.run import SimResult
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.simulate import sim_config, simulate
from tokenrouter.steplog import write_step_logs

JsonOut = Annotated[str | None, typer.Option("--json", help="Write metrics as JSON to FILE ('-' = stdout).")]
CsvOut = Annotated[Path | None, typer.Option("--csv", help="Write per-request rows as CSV.")]
StepLogs = Annotated[
    Path | None,
    typer.Option(
        help="Write every simulated step as JSONL in DIR (steps<i>.jsonl), "
        "the format `tr serve --step-logs` writes live (times in simulated seconds from 0)."
    ),
]
Plot = Annotated[Path | None, typer.Option(help="PNG: per model queue and busy fraction over time, batch histogram; "
                 "throughput; latency CDFs.")]  # fmt: skip


@deployment_flags()
def run(deploy: DeploymentFlags, concurrency: Concurrency = 8, workload: TraceWorkload = None,
        num_requests: NumRequests = 64, seed: Seed = 0, arrival_rate: ArrivalRate = None, max_output: MaxOutput = None,
        json_out: JsonOut = None, csv_out: CsvOut = None, plot: Plot = None, slo_tpot_ms: SloTpot = None,
        search_budget: SearchBudget = DEFAULT_BUDGET_S, jobs: Jobs = 0, dry_run: DryRun = False,
        step_logs: StepLogs = None) -> None:  # fmt: skip
    """Simulate a routed model pair on a GPU profile (CPU only) and print the metrics. Without --thresholds (or
    with 'auto') B is chosen first: the Markov model proposes, the simulator ranks (docs/simulator.md)."""
    objective = Objective(slo_tpot_ms)
    if search_budget <= 0:
        raise ValueError(f"--search-budget must be > 0 seconds, got {search_budget}")
    check_run_flags(num_requests=num_requests, concurrency=concurrency, seed=seed, max_output=max_output,
                    arrival_rate=arrival_rate)  # fmt: skip
    if not dry_run:
        check_output(json_out, "--json")
        check_output(csv_out, "--csv")
        check_output(plot, "--plot", figure=True)
        if step_logs is not None:
            check_step_log_dir(step_logs)
    cfg, auto = sim_config(deploy.resolve(), deploy.b_choice, concurrency=concurrency, workload=workload,
                           num_requests=num_requests, seed=seed, arrival_rate=arrival_rate,
                           max_output=max_output)  # fmt: skip
    cfg.step_logs = step_logs is not None
    if dry_run:
        typer.echo(cfg.deployment.to_yaml().rstrip())
        return
    note_cpu_profile("trsim run", cfg.deployment.profile)
    with sim_pool(jobs if auto else 1) as pool, Heartbeat(Console(stderr=True)) as beat:
        beat.set(f"choosing B at N={cfg.concurrency}" if auto else "simulating")

        def progress(done: int, t: Trial) -> None:
            beat.set(f"choosing B at N={cfg.concurrency}: {done} B simulated, last {format_b(t.thresholds)} "
                     f"{t.tok_s:,.0f} tok/s")  # fmt: skip

        res = simulate(cfg, auto, objective=objective, pool=pool, budget_s=search_budget, progress=progress)
    if json_out != "-":
        print_result(res)
    if json_out:
        write_json(result_record(res), json_out)
    if csv_out:
        df = res.metrics.to_frame()
        for k, v in result_record(res).items():
            if k in ("models", "router", "policy", "thresholds", "placement", "workload", "seed"):
                df[k] = v
        df.to_csv(csv_out, index=False)
    if step_logs is not None:
        write_step_logs(res.extra["step_logs"], step_logs)
        typer.echo(f"wrote step logs to {step_logs}", err=json_out == "-")
    if plot:
        from tokenrouter.plots import RunCell, plot_run

        cell = RunCell.of_sim(res)
        written = plot_run(res.metrics, plot, title=cell.title("trsim run"), names=cell.models,
                           marks=run_marks(res))  # fmt: skip
        typer.echo(f"wrote {written}", err=json_out == "-")  # stdout stays pure JSON with --json -


def check_step_log_dir(d: Path) -> None:
    """--step-logs: a directory (made now) without step logs in it, so a run's files are never mixed with another's."""
    if d.exists() and not d.is_dir():
        raise CliError(f"--step-logs: {d} is a file; give a directory")
    if d.is_dir() and any(d.glob("steps*.jsonl")):
        raise CliError(f"--step-logs: {d} already holds step logs; give an empty or new directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"--step-logs: cannot create {d}: {e.strerror}") from None


def run_marks(res: SimResult) -> list[tuple[float, str]]:
    """Workload phases and autotune's B changes, as (time s, label) marks for the plot."""
    marks = []
    for t, hop, n in res.extra.get("phases", []):
        if 0 < t <= run_end(res):  # a phase after the last request is not on the run's time axis
            what = ", ".join(x for x in (f"p={hop}" if hop is not None else "", f"N={n}" if n else "") if x)
            marks.append((t, f"phase: {what}"))
    for c in res.extra.get("autotune", {}).get("changes", []):
        marks.append((c["at"], f"B={format_b(c['new'])}"))
    return marks
