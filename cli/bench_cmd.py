"""`tr bench --url URL`: load a running server with the simulator's workloads and print the `trsim run` table;
`--sim` simulates the same cell and prints its prediction beside the live numbers."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.cli.common import CliError, Interrupted, check_output, note_cpu_profile, require_extras
from tokenrouter.cli.options import (
    ArrivalRate,
    Concurrency,
    DeploymentFlags,
    MaxOutput,
    Workload,
    check_run_flags,
    deployment_flags,
)
from tokenrouter.cli.progress import counted, progress_bar
from tokenrouter.cli.report import fmt_num, metrics_table, write_json
from tokenrouter.core.policy import format_b
from tokenrouter.workloads import Phase, RequestSpec, initial_phase, load_phases, make_workload

if TYPE_CHECKING:
    from tokenrouter.bench.client import BenchOutcome

_COMPARE = (("output throughput tok/s", "output_throughput_tok_s", 1),
            ("steady throughput tok/s", "steady_output_throughput_tok_s", 1), ("TTFT ms mean", "ttft_ms_mean", 2),
            ("TPOT ms mean", "tpot_ms_mean", 2), ("ITL ms mean", "itl_ms_mean", 2), ("E2E ms mean", "e2e_ms_mean", 2),
            ("E2E ms p99", "e2e_ms_p99", 2), ("hops per request", "hops_mean", 2))  # fmt: skip


def live_summary(out) -> dict[str, Any]:
    """The collector's summary with the per-model busy fraction (the union of its step intervals) and mean batch size
    from the server's counters; NaN (shown as `-`) for what a live bench cannot observe (batch percentiles, ...)."""
    window = (0.0, out.exhausted_at) if out.exhausted_at else None  # the simulator's steady window (closed loop)
    s = out.metrics.summary(window=window)
    for i, name in enumerate(out.model_names):
        steps, rows, _, busy_s = out.samples.totals(name)
        # Interrupted, the server stepped for the cancelled requests after the last one done: busy over the polls
        dur = out.samples.span(name) if out.interrupted else s["duration_s"]
        s[f"busy_frac_model{i}"] = busy_s / dur if dur and dur > 0 and steps else float("nan")
        s[f"batch_mean_model{i}"] = rows / steps if steps else float("nan")
        s[f"batch_p50_model{i}"] = s[f"batch_p99_model{i}"] = s[f"batch_max_model{i}"] = float("nan")
        s[f"steps_model{i}"] = steps
    s["requests_failed"] = float(len(out.errors))
    return s


def threshold_timeline(out, names: list[str]) -> str:
    """`0.0:1,5;3.2:1,1`: the server's thresholds in force from each poll time on (empty when not exported)."""
    return ";".join(f"{t:.1f}:{format_b([b[n] for n in names])}" for t, b in out.samples.thresholds
                    if all(n in b for n in names))  # fmt: skip


def _compare_table(live: dict[str, Any], sim: dict[str, Any], names: list[str]) -> Table:
    t = Table(title="live vs simulated (same cell)", title_justify="left")
    for col in ("metric", "live", "sim", "sim / live"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    rows = list(_COMPARE)
    for i, n in enumerate(names):
        rows += [(f"{n} token share", f"token_frac_model{i}", 3), (f"{n} busy", f"busy_frac_model{i}", 3),
                 (f"{n} mean batch", f"batch_mean_model{i}", 2)]  # fmt: skip
    for label, key, nd in rows:
        a, b = live.get(key, float("nan")), sim.get(key, float("nan"))
        ratio = b / a if a and not math.isnan(a) and not math.isnan(b) else float("nan")
        t.add_row(label, fmt_num(a, nd, "-"), fmt_num(b, nd, "-"), fmt_num(ratio, 2, "-"))
    return t


def _check_phases(phases: list[Phase], specs: list[RequestSpec], admin_key: str | None,
                  arrival_rate: float | None) -> None:  # fmt: skip
    """Refuse a workload whose phases this bench cannot apply, before any request goes out."""
    if any(ph.hop_rate is not None for ph in phases) and admin_key is None:
        raise CliError("the workload's phases change the hop rate: give --admin-key (the server's)")
    open_loop = arrival_rate is not None or any(sp.arrival is not None for sp in specs)
    if open_loop and any(ph.concurrency is not None for ph in phases):
        raise CliError("workload phases that set 'concurrency' need a closed loop (no --arrival-rate or arrivals)")


def _run_live(url: str, specs: list[RequestSpec], phases: list[Phase], console: Console, *, concurrency: int,
              arrival_rate: float | None, seed: int, api_key: str | None, admin_key: str | None,
              duration: float | None) -> BenchOutcome:  # fmt: skip
    """Send the workload to the server at `url` with a progress bar; an unreachable server is one line."""
    import httpx

    from tokenrouter.bench.client import run_bench

    with progress_bar(console, *counted("bench")) as bar:
        task = bar.add_task("requests", total=len(specs))
        try:
            run = run_bench(url.rstrip("/"), specs, concurrency=concurrency, arrival_rate=arrival_rate, seed=seed,
                            api_key=api_key, on_done=lambda: bar.advance(task), phases=phases, admin_key=admin_key,
                            duration_s=duration)  # fmt: skip
            out = asyncio.run(run)
        except (httpx.HTTPError, RuntimeError) as e:
            raise CliError(f"cannot benchmark {url}: {type(e).__name__}: {e}") from None
        bar.update(task, total=out.requests_sent)  # --duration: out of what was sent, not what was planned
    return out


def _print_run(console: Console, out: BenchOutcome, phases: list[Phase], workload: str, num_specs: int,
               concurrency: int, arrival_rate: float | None, seed: int) -> None:  # fmt: skip
    """The line under the table: the workload, the load, the phases applied and B over time."""
    first = initial_phase(phases)
    n0 = first.concurrency if first is not None and first.concurrency else concurrency
    ramps = " (then as the phases say)" if any(ph.concurrency for ph in phases if ph.at_s > 0) else ""
    mode = f"Poisson {arrival_rate} req/s" if arrival_rate else f"N = {n0}{ramps}"
    sent = "" if out.requests_sent == num_specs else f" ({out.requests_sent} sent before --duration)"
    if out.interrupted:
        done = int(out.metrics.summary()["requests_completed"])
        sent = (f" (INTERRUPTED by Ctrl-C: {out.requests_sent} sent, {done} done, {out.requests_cancelled} in flight "
                "cancelled and not counted)")  # fmt: skip
    console.print(f"{workload} x {num_specs}{sent}, {mode}, seed {seed}; wall {out.wall_s:.2f} s")
    for t, ph in out.phases:
        parts = [f"hop rate {ph.hop_rate}" if ph.hop_rate is not None else "",
                 f"N = {ph.concurrency}" if ph.concurrency is not None else ""]  # fmt: skip
        console.print(f"phase at {t:.1f} s: {', '.join(w for w in parts if w)}")
    if len(out.samples.thresholds) > 1:
        console.print(f"B over time (server's thresholds in force): {threshold_timeline(out, out.model_names)}")


Url = Annotated[str, typer.Option(help="Server base URL, e.g. http://127.0.0.1:8000")]
BenchRequests = Annotated[int, typer.Option(help="Requests to send.")]
Duration = Annotated[float | None, typer.Option(help="Stop sending after this many seconds (running requests "
                     "finish); the run then ends at whichever comes first, --num-requests or the time. The JSON's "
                     "requests_sent counts what went out.")]  # fmt: skip
BenchSeed = Annotated[int, typer.Option(help="Seed of the workload (and of --sim).")]
ApiKey = Annotated[str | None, typer.Option(help="Bearer key if the server has one.")]
AdminKey = Annotated[str | None, typer.Option(envvar="TOKENROUTER_ADMIN_KEY", help="The server's admin key: needed "
                     "when the workload's phases change the hop rate (set live through POST "
                     "/admin/policy).")]  # fmt: skip
JsonOut = Annotated[str | None, typer.Option("--json", help="Metrics as JSON to FILE ('-' = stdout).")]
CsvOut = Annotated[Path | None, typer.Option("--csv", help="Per-request rows as CSV.")]
Plot = Annotated[Path | None, typer.Option(help="PNG of the run (with --sim: live and simulated).")]
Sim = Annotated[bool, typer.Option("--sim/--no-sim", help="Also simulate this cell and compare: the deployment is "
                "--config (what the server runs) with the deployment flags applied, as `tr serve` applies "
                "them.")]  # fmt: skip
BenchDryRun = Annotated[bool, typer.Option("--dry-run", help="Print the deployment --sim would simulate (YAML) and "
                        "exit.")]  # fmt: skip


@deployment_flags()
def bench(deploy: DeploymentFlags, url: Url, concurrency: Concurrency = 8, arrival_rate: ArrivalRate = None,
          workload: Workload = "low-effort", num_requests: BenchRequests = 64, duration: Duration = None,
          max_output: MaxOutput = None, seed: BenchSeed = 0, api_key: ApiKey = None, admin_key: AdminKey = None,
          json_out: JsonOut = None, csv_out: CsvOut = None, plot: Plot = None, sim: Sim = False,
          dry_run: BenchDryRun = False) -> None:  # fmt: skip
    """Benchmark a running server (streaming, token-id prompts, ignore_eos) and print the metrics table."""
    require_extras("bench", ("serve",), modules=("httpx", "prometheus_client"))
    check_run_flags(num_requests=num_requests, concurrency=concurrency, seed=seed, max_output=max_output,
                    arrival_rate=arrival_rate)  # fmt: skip
    if duration is not None and not duration > 0:
        raise CliError(f"--duration must be a positive number of seconds, got {duration}")
    if dry_run:
        typer.echo(deploy.resolve().to_yaml().rstrip())
        return
    check_output(json_out, "--json")
    check_output(csv_out, "--csv")
    check_output(plot, "--plot", figure=True)
    specs = make_workload(workload, num_requests, seed, arrival_rate=arrival_rate, max_output=max_output)
    phases = load_phases(workload)
    _check_phases(phases, specs, admin_key, arrival_rate)
    checked = _sim_cell(deploy, url, api_key, concurrency=concurrency, workload=workload, num_requests=num_requests,
                        seed=seed, arrival_rate=arrival_rate, max_output=max_output) if sim else None  # fmt: skip
    err_console = Console(stderr=True)
    console = err_console if json_out == "-" else Console()
    out = _run_live(url, specs, phases, err_console, concurrency=concurrency, arrival_rate=arrival_rate, seed=seed,
                    api_key=api_key, admin_key=admin_key, duration=duration)  # fmt: skip
    live = live_summary(out)
    names = out.model_names
    if json_out != "-":
        cut = " (INTERRUPTED: what was measured until Ctrl-C)" if out.interrupted else ""
        console.print(metrics_table(live, names, f"tr bench: {out.served_model} at {url}{cut}", missing="-"))
        _print_run(console, out, phases, workload, len(specs), concurrency, arrival_rate, seed)
    if out.errors:
        err_console.print(f"{len(out.errors)} requests failed; first: {out.errors[0]}", soft_wrap=True)
    record = {"url": url, "models": ",".join(names), "workload": workload, "num_requests": len(specs),
              "requests_sent": out.requests_sent, "duration_limit_s": duration,
              "concurrency": None if arrival_rate else concurrency, "arrival_rate": arrival_rate, "seed": seed,
              "thresholds_timeline": threshold_timeline(out, names), **live}  # fmt: skip
    record.update(interrupted=out.interrupted, requests_cancelled=out.requests_cancelled)
    planned = out.requests_sent if duration is not None else num_requests
    sim_res = _compare_sim(checked, out, live, planned, console if json_out != "-" else None, err_console, record)
    if json_out:
        write_json(record, json_out)
    if csv_out:
        out.metrics.to_frame().to_csv(csv_out, index=False)
    if plot:
        _plot(out, plot, sim_res, concurrency=concurrency, arrival_rate=arrival_rate, json_out=json_out)
    _end_of_run(out, url, len(specs), int(record["requests_completed"]))


def _compare_sim(checked: Any, out: BenchOutcome, live: dict[str, Any], requests: int, console: Console | None,
                 err_console: Console, record: dict[str, Any]) -> Any:  # fmt: skip
    """--sim after the live run: simulate the `requests` sent, print the comparison on `console` (None: stdout holds
    the JSON) and add the `sim_` keys to `record`. Not for an interrupted run (its numbers cover only part of it)."""
    if checked is None:
        return None
    if out.interrupted:
        err_console.print("--sim: not simulated, the live run was interrupted")
        return None
    from tokenrouter.cli.bench_sim import simulate_sent

    sim_res = simulate_sent(checked, requests)
    if console is not None:
        dep = sim_res.config.deployment
        console.print(_compare_table(live, sim_res.summary, out.model_names))
        console.print(f"simulated with profile {dep.profile}, policy {dep.policy_label}")
    record.update({f"sim_{k}": v for k, v in sim_res.summary.items()})
    return sim_res


def _plot(out: BenchOutcome, plot: Path, sim_res: Any, *, concurrency: int, arrival_rate: float | None,
          json_out: str | None) -> None:  # fmt: skip
    """--plot: the live run, beside the simulated one with --sim. The plotting stack is imported only here."""
    from tokenrouter.plots import RunCell, plot_bench

    names = out.model_names
    # The title's router, policy and B come from the --sim cell; the server reports only its models.
    live = RunCell(names, concurrency=None if arrival_rate else concurrency, arrival_rate=arrival_rate)
    cell = RunCell.of_sim(sim_res, models=names) if sim_res else live
    written = plot_bench(out, plot, sim=sim_res.metrics if sim_res else None, cell=cell)
    typer.echo(f"wrote {written}", err=json_out == "-")  # stdout stays pure JSON with --json -


def _sim_cell(deploy: DeploymentFlags, url: str, api_key: str | None, **run: Any) -> Any:
    """--sim's cell, checked before the live run (`bench_sim.check_sim`), and a line when its profile was measured
    on CPU. The simulator is imported here: `tr bench` without --sim (and `tr serve`, the same app) runs without."""
    from tokenrouter.cli.bench_sim import check_sim

    checked = check_sim(deploy, url, api_key, **run)
    note_cpu_profile("tr bench --sim", checked[0].deployment.profile)
    return checked


def _end_of_run(out: BenchOutcome, url: str, planned: int, done: int) -> None:
    """After what was measured is printed and written: a run that did not complete ends in one line, non-zero."""
    if out.interrupted:
        raise Interrupted(f"interrupted after {done} of {planned} requests ({out.requests_cancelled} cancelled in "
                          "flight); what was measured is above")  # fmt: skip
    if out.unreachable is not None:
        typer.echo(f"tokenrouter: error: the server at {url} went away during the run ({out.unreachable}); "
                   f"{len(out.errors)} of {out.requests_sent} requests failed", err=True)  # fmt: skip
        raise typer.Exit(1)
