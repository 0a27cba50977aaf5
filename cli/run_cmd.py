"""`trsim run`: simulate one deployment under one workload."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated

import typer

from tokenrouter.cli.common import CliError, check_output
from tokenrouter.cli.options import (
    ArrivalRate,
    Concurrency,
    DeploymentFlags,
    DryRun,
    MaxOutput,
    NumRequests,
    Seed,
    Workload,
    deployment_flags,
)
from tokenrouter.cli.report import print_result, result_record, write_json
from tokenrouter.core.config import ConfigError
from tokenrouter.core.policy import PolicyKind
from tokenrouter.sim.run import SimConfig, SimResult, run_sim
from tokenrouter.sim.tune import check_search_concurrency
from tokenrouter.workloads import initial_phase, load_phases


def sim_config(
    deploy: DeploymentFlags,
    *,
    concurrency: int = 8,
    workload: str = "low-effort",
    num_requests: int = 64,
    seed: int = 0,
    arrival_rate: float | None = None,
    max_output: int | None = None,
) -> tuple[SimConfig, bool]:
    """The SimConfig of one simulated run: the resolved deployment and the run flags; also whether thresholds are
    'auto' (the Markov model's B* for this N: asked for, or the default of a delayed run without a config)."""
    dep = deploy.resolve()
    first = initial_phase(load_phases(workload))  # a phase at 0 s replaces --concurrency / --hop-rate
    if first is not None and first.concurrency is not None:
        concurrency = first.concurrency
    if first is not None and first.hop_rate is not None:
        dep = dataclasses.replace(dep, router=dataclasses.replace(dep.router, hop_rate=first.hop_rate))
    given = deploy.overrides.thresholds is not None
    auto = deploy.thresholds_auto or (deploy.config is None and not given)
    auto = auto and dep.policy.kind == PolicyKind.DELAYED
    if auto:
        check_search_concurrency(concurrency, "; give --thresholds to simulate a B of your choice")
    if given and dep.policy.kind == PolicyKind.DELAYED:
        try:
            dep.policy.check(len(dep.models), concurrency)
        except ConfigError as e:
            raise CliError(f"--thresholds: {e}") from None
    cfg = SimConfig(
        dep,
        workload=workload,
        num_requests=num_requests,
        concurrency=concurrency,
        arrival_rate=arrival_rate,
        seed=seed,
        max_output=max_output,
    )
    return cfg, auto


def simulate(cfg: SimConfig, auto: bool) -> SimResult:
    note = ""
    if auto:
        from tokenrouter.sim.tune import predict_thresholds

        pred = predict_thresholds(cfg)
        pc = cfg.deployment.policy.with_thresholds(pred.thresholds)
        cfg = dataclasses.replace(cfg, deployment=dataclasses.replace(cfg.deployment, policy=pc))
        predicted = "n/a" if math.isnan(pred.throughput) else f"{pred.throughput:,.0f} tok/s"
        fallback = f"; {pred.note}" if pred.note else ""
        note = f" (auto: Markov B* for N={cfg.concurrency}, predicted {predicted}{fallback})"
    res = run_sim(cfg)
    res.extra["thresholds_note"] = note
    return res


def register(app: typer.Typer) -> None:
    @app.command("run")
    @deployment_flags()
    def run(
        deploy: DeploymentFlags,
        concurrency: Concurrency = 8,
        workload: Workload = "low-effort",
        num_requests: NumRequests = 64,
        seed: Seed = 0,
        arrival_rate: ArrivalRate = None,
        max_output: MaxOutput = None,
        json_out: Annotated[
            str | None, typer.Option("--json", help="Write metrics as JSON to FILE ('-' = stdout).")
        ] = None,
        csv_out: Annotated[Path | None, typer.Option("--csv", help="Write per-request rows as CSV.")] = None,
        plot: Annotated[
            Path | None,
            typer.Option(
                help="PNG: per model queue and busy fraction over time, batch histogram; throughput; latency CDFs."
            ),
        ] = None,
        dry_run: DryRun = False,
    ) -> None:
        """Simulate a routed model pair on a GPU profile (CPU only) and print the metrics."""
        if not dry_run:
            check_output(json_out, "--json")
            check_output(csv_out, "--csv")
            check_output(plot, "--plot", figure=True)
        cfg, auto = sim_config(
            deploy,
            concurrency=concurrency,
            workload=workload,
            num_requests=num_requests,
            seed=seed,
            arrival_rate=arrival_rate,
            max_output=max_output,
        )
        if dry_run:
            typer.echo(cfg.deployment.to_yaml().rstrip())
            return
        res = simulate(cfg, auto)
        if json_out != "-":
            print_result(res)
        if json_out:
            write_json(res, json_out)
        if csv_out:
            df = res.metrics.to_frame()
            for k, v in result_record(res).items():
                if k in ("models", "router", "policy", "thresholds", "placement", "workload", "seed"):
                    df[k] = v
            df.to_csv(csv_out, index=False)
        if plot:
            from tokenrouter.plots import RunCell, plot_run

            cell = RunCell.of_sim(res)
            written = plot_run(res.metrics, plot, title=cell.title("trsim run"), names=cell.models,
                               marks=run_marks(res))  # fmt: skip
            typer.echo(f"wrote {written}", err=json_out == "-")  # stdout stays pure JSON with --json -


def run_marks(res: SimResult) -> list[tuple[float, str]]:
    """Workload phases and autotune's B changes, as (time s, label) marks for the plot."""
    marks = []
    for t, hop, n in res.extra.get("phases", []):
        if t > 0:
            what = ", ".join(x for x in (f"p={hop}" if hop is not None else "", f"N={n}" if n else "") if x)
            marks.append((t, f"phase: {what}"))
    for c in res.extra.get("autotune", {}).get("changes", []):
        marks.append((c["at"], f"B={','.join(map(str, c['new']))}"))
    return marks
