"""`trsim run`: simulate one deployment under one workload."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from tokenrouter.cli.common import CliError, deployment_from_flags, parse_list
from tokenrouter.cli.report import print_result, result_record, write_json
from tokenrouter.core.config import load_config
from tokenrouter.core.policy import guard_holds
from tokenrouter.sim.run import SimConfig, SimResult, run_sim

HopRate = Annotated[
    float,
    typer.Option(
        "--hop-rate",
        "-p",
        help="Probability that the small model hands a token "
        "to the large one after each step (the synthetic router's signal).",
    ),
]
Concurrency = Annotated[int, typer.Option("--concurrency", "-n", help="Closed-loop clients N (live requests).")]


def sim_config_from_flags(
    *,
    hop_rate: float = 0.1,
    concurrency: int = 8,
    small: str = "qwen3-0.6b",
    large: str = "qwen3-32b",
    models: str | None = None,
    policy: str = "delayed",
    thresholds: str = "auto",
    placement: str = "mps",
    workload: str = "low-effort",
    num_requests: int = 64,
    router: str = "r2r",
    return_prob: float = 1.0,
    trace: str | None = None,
    profile: str = "h200",
    seed: int = 0,
    arrival_rate: float | None = None,
    max_output: int | None = None,
    graphs: bool = True,
    overlap: bool = True,
    page_size: int = 16,
    max_batch_size: int = 256,
    max_batch_tokens: int = 16384,
    config: Path | None = None,
) -> tuple[SimConfig, bool]:
    """Build the SimConfig from `trsim run` flags (defaults = run's); returns (config, thresholds_auto)."""
    if config is not None:
        dep = load_config(config)
        auto = False
    else:
        names = parse_list(models, str, "--models") if models else [small, large]
        auto = thresholds.strip().lower() == "auto"
        thr = None if auto or not thresholds.strip() else parse_list(thresholds, int, "--thresholds")
        if thr is not None and len(thr) != len(names):
            raise CliError(f"--thresholds needs one value per model ({len(names)}), got {thresholds!r}")
        if thr is not None and policy == "delayed" and not guard_holds(thr, concurrency):
            raise CliError(
                f"--thresholds {thresholds} infeasible for concurrency {concurrency}: the deadlock "
                f"guard needs sum(B_i - 1) < N"
            )
        dep = deployment_from_flags(
            models=names,
            placement=placement,
            policy=policy,
            thresholds=thr,
            router=router,
            hop_rate=hop_rate,
            return_prob=return_prob,
            trace=trace,
            profile=profile,
            graphs=graphs,
            overlap=overlap,
            page_size=page_size,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
        )
        auto = auto and policy == "delayed"
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
        cfg.deployment.policy.thresholds = list(pred.thresholds)
        predicted = "n/a" if math.isnan(pred.throughput) else f"{pred.throughput:,.0f} tok/s"
        fallback = f"; {pred.note}" if pred.note else ""
        note = f" (auto: Markov B* for N={cfg.concurrency}, predicted {predicted}{fallback})"
    res = run_sim(cfg)
    res.extra["thresholds_note"] = note
    return res


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        hop_rate: HopRate = 0.1,
        concurrency: Concurrency = 8,
        small: Annotated[str, typer.Option(help="Small (entry) model: a bundled name or HF dir.")] = "qwen3-0.6b",
        large: Annotated[str, typer.Option(help="Large model.")] = "qwen3-32b",
        models: Annotated[
            str | None,
            typer.Option(help="Comma list of >= 2 models (overrides --small/--large; for the 'me' ensemble)."),
        ] = None,
        policy: Annotated[
            str,
            typer.Option(
                help="step-sync | model-sync | eager | delayed | std-serving (one server per model: every hop "
                "a new request that re-matches its prefix)"
            ),
        ] = "delayed",
        thresholds: Annotated[
            str,
            typer.Option(
                help="Delayed-batching B per model, e.g. 1,3; 'auto' = the Markov model's B* for this concurrency "
                "(exact up to about N = 8; larger N runs a reduced search and says so)."
            ),
        ] = "auto",
        placement: Annotated[str, typer.Option(help="mps (one shared GPU) | separate | cross-host")] = "mps",
        workload: Annotated[
            str, typer.Option(help="low-effort | high-effort | agentic | fixed:P,O | FILE.jsonl")
        ] = "low-effort",
        num_requests: Annotated[int, typer.Option(help="Requests to run.")] = 64,
        router: Annotated[str, typer.Option(help="r2r | citer | co-llm | r-stitch | markov | me | trace")] = "r2r",
        return_prob: Annotated[
            float,
            typer.Option(help="r-stitch: probability the large model hands back after each token (mean run 1/q)."),
        ] = 1.0,
        trace: Annotated[str | None, typer.Option(help="Hop trace JSONL for --router trace.")] = None,
        profile: Annotated[str, typer.Option(help="Profile name (h200) or JSON file.")] = "h200",
        seed: Annotated[int, typer.Option(help="Seed for workload and routers.")] = 0,
        arrival_rate: Annotated[
            float | None, typer.Option(help="Open loop: Poisson arrivals per second (default: closed loop).")
        ] = None,
        max_output: Annotated[int | None, typer.Option(help="Cap output lengths.")] = None,
        graphs: Annotated[bool, typer.Option("--graphs/--no-graphs", help="CUDA graphs in the cost model.")] = True,
        overlap: Annotated[
            bool,
            typer.Option(
                "--overlap/--no-overlap",
                help="CPU-GPU overlap: prepare step k+1 while step k runs (two batches in flight; sync policies "
                "never overlap).",
            ),
        ] = True,
        page_size: Annotated[int, typer.Option(help="KV page size (tokens).")] = 16,
        max_batch_size: Annotated[int, typer.Option(help="Max rows per step.")] = 256,
        max_batch_tokens: Annotated[int, typer.Option(help="Max tokens per step (prefill chunking).")] = 16384,
        config: Annotated[
            Path | None,
            typer.Option(help="Deployment YAML (as written by trsim tune); overrides the deployment flags."),
        ] = None,
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
    ) -> None:
        """Simulate a routed model pair on the bundled H200 profile (CPU only) and print the metrics."""
        cfg, auto = sim_config_from_flags(
            hop_rate=hop_rate,
            concurrency=concurrency,
            small=small,
            large=large,
            models=models,
            policy=policy,
            thresholds=thresholds,
            placement=placement,
            workload=workload,
            num_requests=num_requests,
            router=router,
            return_prob=return_prob,
            trace=trace,
            profile=profile,
            seed=seed,
            arrival_rate=arrival_rate,
            max_output=max_output,
            graphs=graphs,
            overlap=overlap,
            page_size=page_size,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            config=config,
        )
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
            written = plot_run(res.metrics, plot, title=cell.title("trsim run"), names=cell.models)
            typer.echo(f"wrote {written}", err=json_out == "-")  # stdout stays pure JSON with --json -
