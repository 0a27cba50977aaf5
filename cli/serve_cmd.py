"""`tr serve`: launch the subservers of a deployment and the HTTP front-end over them (docs/cli.md, docs/runtime.md)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tokenrouter.cli.common import CliError, Interrupted, RunFailed, check_output, require_extras
from tokenrouter.cli.options import DeploymentFlags, DryRun, deployment_flags
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.runtime.preflight import check_launch, preflight

if TYPE_CHECKING:
    from tokenrouter.runtime.launcher import Server

Opt = typer.Option


Device = Annotated[str, Opt(help="cpu or cuda.")]
Host = Annotated[str, Opt(help="Address the HTTP server binds.")]
Port = Annotated[int, Opt(help="HTTP port.")]
ApiKey = Annotated[str | None, Opt(help="Require this bearer key (401 without it; /health stays open).")]
AdminKey = Annotated[
    str | None,
    Opt(envvar="TOKENROUTER_ADMIN_KEY", help="Enable POST/GET /admin/policy (Bearer KEY): change the policy, "
        "thresholds and a synthetic router's hop rate while serving (live sweeps, controllers)."),
]  # fmt: skip
RecordHops = Annotated[Path | None, Opt(help="Write the hop trace JSONL here on exit.")]
StepLogs = Annotated[Path | None, Opt(help="Write every step of every model here as JSONL (steps<i>.jsonl: "
                     "launch and done times on the host's monotonic clock, rows, tokens, context; std-serving also "
                     "visits.jsonl), for timelines and for `trsim` comparisons. The directory must hold no step logs "
                     "yet; lines are written as steps end and flushed when the server stops.")]  # fmt: skip
KvTokens = Annotated[int, Opt(help="CPU only: KV capacity per model in tokens.")]
Baseline = Annotated[str | None, Opt(help="Run a baseline on the same engine instead of the routed runtime: "
                     "std-serving (one continuous-batching server per model with prefix caching, and a dispatcher "
                     "that sends every hop as a new request carrying the whole sequence; also what `baseline: "
                     "std-serving` and --policy std-serving run), llm-only or slm-only (the large or small model).")
                     ]  # fmt: skip
RestartOnFailure = Annotated[bool, Opt("--restart-on-failure", help="Restart a subserver that dies, in "
                             "place: requests in flight fail once, new ones get 503 until it is back. "
                             "Without it the server exits non-zero for a supervisor to restart.")]  # fmt: skip
Ray = Annotated[str | None, Opt(help="Run each subserver as a Ray actor (one placement group; as many GPUs as "
                "the model lists), over tcp: a Ray address, 'auto' (the running cluster), or 'local' (start a "
                "head here). The launcher and the HTTP front-end stay in this process. Needs the 'ray' extra.")
                ]  # fmt: skip
RayCpus = Annotated[float, Opt(help="--ray: CPUs each subserver's actor reserves.")]
HeartbeatTimeout = Annotated[float, Opt(help="A subserver that sends no heartbeat for this many seconds has "
                             "failed: one this process started is hung and gets killed (then restarted with "
                             "--restart-on-failure, else the server exits 1); one it did not start (external: "
                             "true, or a Ray actor) is given up.")]  # fmt: skip
JoinTimeout = Annotated[float, Opt(help="Over tcp: seconds start-up waits for every subserver to join (an "
                        "external one is started by hand: `tokenrouter subserver --join ...`).")]  # fmt: skip
ShutdownTimeout = Annotated[float, Opt(help="Seconds running requests get to finish on SIGTERM/SIGINT; "
                            "then they end with an error chunk.")]  # fmt: skip
EngineOpts = Annotated[list[str] | None, Opt("--engine", help="KEY=VALUE: an EngineConfig switch for every model's "
                       "engine (repeat for several), e.g. --engine extend_split_keys=1024; booleans take "
                       "true/false. Keys the deployment sets (model, KV pool, graph rule) are refused.")]  # fmt: skip
LogLevel = Annotated[str, Opt(help="debug | info | warning | error.")]
NoAccessLog = Annotated[bool, Opt("--no-access-log", help="No log line per request.")]


@deployment_flags()
def serve(deploy: DeploymentFlags, device: Device = "cuda", host: Host = "127.0.0.1", port: Port = 8000,
          api_key: ApiKey = None, admin_key: AdminKey = None, record_hops: RecordHops = None,
          kv_tokens: KvTokens = 8192, baseline: Baseline = None, dry_run: DryRun = False,
          restart_on_failure: RestartOnFailure = False, ray: Ray = None, ray_cpus: RayCpus = 1.0,
          heartbeat_timeout: HeartbeatTimeout = 10.0, join_timeout: JoinTimeout = 300.0,
          shutdown_timeout: ShutdownTimeout = 30.0, log_level: LogLevel = "info",
          no_access_log: NoAccessLog = False, step_logs: StepLogs = None,
          engine: EngineOpts = None) -> None:  # fmt: skip
    """Serve a deployment: one process per model, OpenAI-compatible HTTP in front. The deployment is --config
    (what `trsim tune` writes) with the flags applied, or --small/--large with defaults. --baseline (or --policy
    std-serving) serves a baseline of the same deployment on the same engine instead."""
    check_launch(None, device, restart_on_failure)  # a PreflightError is a user error: one line, exit 2
    from tokenrouter.runtime.logs import configure_logging

    try:
        configure_logging(log_level)
    except ValueError as e:
        raise CliError(f"--log-level: {e}") from None
    ov = deploy.overrides
    if deploy.config is None and not (ov.small and ov.large) and not ov.models:
        raise CliError("give --config FILE or both --small and --large")
    if deploy.thresholds_auto:
        raise CliError("--thresholds auto is for the simulator; serving takes B per model (e.g. 1,7) or a config")
    cfg = deploy.resolve()
    baseline = _baseline(cfg, baseline, restart_on_failure)
    check_launch(cfg, device, restart_on_failure)
    if shutdown_timeout < 0:
        raise CliError(f"--shutdown-timeout must be >= 0, got {shutdown_timeout}")
    if not dry_run:
        check_output(record_hops, "--record-hops")  # written on exit: found unwritable now, not after the serving
        _check_step_logs(step_logs, ray is not None or cfg.transport == "tcp")
    require_extras("serve", ("serve", "engine"))
    from tokenrouter.deploy.engine_args import parse_engine_overrides

    try:
        engine_overrides = parse_engine_overrides(engine or [])
    except ValueError as e:
        raise CliError(f"--engine: {e}") from None
    if ray is not None:
        if baseline is not None:
            raise CliError("--ray runs the routed subservers; a baseline runs on one host")
        require_extras("serve --ray", ("ray",))
    if heartbeat_timeout <= 0 or join_timeout <= 0 or ray_cpus <= 0:
        raise CliError("--heartbeat-timeout, --join-timeout and --ray-cpus must be > 0")
    from tokenrouter.runtime.launcher import Server

    cfg, served = _on_device(cfg, ov, device, kv_tokens, baseline)
    if dry_run:
        typer.echo(served.to_yaml().rstrip())
        return
    from tokenrouter.runtime.frontend import serve_http

    _before_start(served, baseline, device=device, host=host, port=port, local=ray is None and cfg.transport != "tcp")
    tok = entry_tokenizer(served)
    Server.install_signal_handlers()
    # SIGINT/SIGTERM while starting: leave the `with`, which stops everything; once serving, serve_http drains.
    server = _server(cfg, baseline, deploy.config, device=device, record_hops=record_hops, step_logs=step_logs,
                     restart_on_failure=restart_on_failure, ray=ray, ray_cpus=ray_cpus,
                     heartbeat_timeout=heartbeat_timeout, join_timeout=join_timeout,
                     engine_overrides=engine_overrides)  # fmt: skip
    with _started(server), contextlib.suppress(KeyboardInterrupt):
        serve_http(server, host=host, port=port, api_key=api_key, tokenizer=tok, shutdown_timeout_s=shutdown_timeout,
                   access_log=not no_access_log, t0=server.t0, admin_key=admin_key,
                   heartbeat_timeout_s=heartbeat_timeout)  # fmt: skip
    if server.failure is not None:  # a subserver died: exit non-zero so a supervisor restarts the server
        raise typer.Exit(1)


def _baseline(cfg: DeploymentConfig, baseline: str | None, restart_on_failure: bool) -> str | None:
    """The baseline to serve (--baseline, or std-serving for --policy std-serving), checked against the
    deployment; None: the routed runtime."""
    from tokenrouter.baselines.modes import BASELINES, baseline_config

    baseline = baseline or cfg.baseline
    if baseline is not None:
        if baseline not in BASELINES:
            raise CliError(f"--baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
        if restart_on_failure:
            raise CliError("--restart-on-failure is for the routed runtime; a baseline stops when a process dies")
        try:
            baseline_config(cfg, baseline)  # the deployment it runs (a single model for llm-only / slm-only)
        except ValueError as e:
            raise CliError(f"--baseline {baseline}: {e}") from None
    return baseline


def _server(cfg: DeploymentConfig, baseline: str | None, config_path: Path | None, *, device: str,
            record_hops: Path | None, restart_on_failure: bool, ray: str | None, ray_cpus: float,
            heartbeat_timeout: float, join_timeout: float, step_logs: Path | None = None,
            engine_overrides: dict | None = None) -> Server:  # fmt: skip
    """The server to run (not started): the baseline's, or the routed runtime's (over a cluster with --ray or a
    tcp transport). What it refuses is one line."""
    from tokenrouter.runtime.cluster import ClusterOptions
    from tokenrouter.runtime.launcher import Server

    if baseline is not None:
        from tokenrouter.baselines.launcher import BaselineServer

        try:
            return BaselineServer(cfg, baseline, device=device, record_hops=record_hops,
                                  heartbeat_timeout_s=heartbeat_timeout, step_logs=step_logs or False,
                                  engine_overrides=engine_overrides)  # fmt: skip
        except ValueError as e:
            raise CliError(f"--baseline {baseline}: {e}") from None
    cluster = None
    if ray is not None or cfg.transport == "tcp":
        cluster = ClusterOptions(ray=ray, heartbeat_timeout_s=heartbeat_timeout, join_timeout_s=join_timeout,
                                 ray_num_cpus=ray_cpus,
                                 config_path=str(config_path) if config_path else None)  # fmt: skip
    try:
        return Server(cfg, device=device, record_hops=record_hops, restart_on_failure=restart_on_failure,
                      cluster=cluster, heartbeat_timeout_s=heartbeat_timeout, step_logs=step_logs or False,
                      engine_overrides=engine_overrides)  # fmt: skip
    except (ValueError, ImportError, RuntimeError, ConnectionError) as e:
        # a deployment the cluster layer refuses (runtime.cluster), Ray missing, unreachable or too small
        raise CliError(str(e).splitlines()[0]) from None


def _check_step_logs(step_logs: Path | None, remote: bool) -> None:
    """--step-logs: a directory this host can write that holds no step logs yet; not over a cluster."""
    if step_logs is None:
        return
    if remote:
        raise CliError("--step-logs needs every subserver on this host (not --ray or a tcp transport)")
    from tokenrouter.runtime.launcher import check_step_log_dir

    try:
        d = check_step_log_dir(step_logs)
    except (ValueError, OSError) as e:
        raise CliError(f"--step-logs: {e}") from None
    probe = d / ".write-test"
    try:
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CliError(f"--step-logs: cannot write in {d}: {e.strerror}") from None


def _on_device(cfg: DeploymentConfig, ov: DeploymentOverrides, device: str, kv_tokens: int,
               baseline: str | None) -> tuple[DeploymentConfig, DeploymentConfig]:  # fmt: skip
    """The deployment on `device` and what runs (a baseline's deployment when one runs). A flag that would change
    nothing is refused (--autotune beside a baseline) or, GPU-only ones on CPU, named in one warning line."""
    from tokenrouter.baselines.modes import baseline_config
    from tokenrouter.runtime.launcher import with_cpu_kv_tokens

    if baseline is not None and ov.autotune:
        raise CliError(f"--autotune re-tunes the routed runtime's B; --baseline {baseline} has none to tune")
    if device == "cpu":
        if kv_tokens < 1:
            raise CliError(f"--kv-tokens must be >= 1, got {kv_tokens}")
        on_gpu = ov.placement in ("mps", "separate")  # cross-host also sets the transport, which CPU runs use
        given = {"--sm-percent": ov.sm_percent, f"--placement {ov.placement}": on_gpu or None, "--gpus": ov.gpus}
        if gpu_only := [flag for flag, v in given.items() if v is not None]:
            typer.echo(f"tr serve: {', '.join(gpu_only)} only apply on GPUs: ignored with --device cpu", err=True)
        cfg = with_cpu_kv_tokens(cfg, kv_tokens)
    return cfg, cfg if baseline is None else baseline_config(cfg, baseline)


def _before_start(served: DeploymentConfig, baseline: str | None, *, device: str, host: str, port: int,
                  local: bool) -> None:  # fmt: skip
    """Refuse what can be checked before loading (one line, exit 2), then say what runs, at every log level."""
    from tokenrouter.deploy.summary import describe_deployment

    preflight(served, device=device, host=host, port=port, local=local)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
    for line in describe_deployment(served, device=device, baseline=baseline, url=url):
        typer.echo(f"tr serve: {line}", err=True)


@contextlib.contextmanager
def _started(server: Server) -> Iterator[Server]:
    """`with server`, where a subserver that fails during start-up is one line (exit 1); its traceback is in the
    log at debug level."""
    from tokenrouter.runtime.launcher import StartupError

    try:
        server.start()
    except StartupError as e:
        logging.getLogger(__name__).debug("start-up failed", exc_info=True)
        raise RunFailed(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while starting: `start` stopped what it started
        raise Interrupted("interrupted during start-up; every process it started has stopped") from None
    try:
        yield server
    finally:
        server.stop()


def entry_tokenizer(cfg):
    """The entry model's tokenizer; for dummy weights without one (bundled shapes such as qwen3-32b), an
    ids-only tokenizer: prompts as token ids, which is what `tr bench` sends. Resolved before any process starts."""
    from tokenrouter.models import load_spec, load_tokenizer
    from tokenrouter.models.ids_only import IdsOnlyTokenizer

    mc = cfg.models[cfg.entry]
    try:
        return load_tokenizer(mc.path or mc.name)
    except (OSError, ValueError) as e:
        if mc.path is not None:
            raise CliError(f"no tokenizer for {mc.name}: {e}") from None
        typer.echo(f"tr serve: {mc.name} has no tokenizer here (dummy weights): serving token-id prompts only",
                   err=True)  # fmt: skip
        return IdsOnlyTokenizer(load_spec(mc.name).vocab_size)
