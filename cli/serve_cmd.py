"""`tr serve`: launch the subservers of a deployment and the HTTP front-end over them.

The deployment comes from `--config serve.yaml` (what `trsim tune` writes) or from `--small/--large`; flags
given on the command line override the config's common fields. `--dry-run` prints the resolved deployment.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from tokenrouter.cli.common import CliError
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig, check_prob, load_config

Opt = typer.Option


def resolve(config: Path | None, small: str | None, large: str | None, router: str | None,
            router_model: str | None, hop_rate: float | None, policy: str | None, thresholds: str | None,
            placement: str | None, gpus: str | None, no_cuda_graph: bool,
            no_overlap: bool) -> DeploymentConfig:  # fmt: skip
    """The deployment `tr serve` runs: the config file (or a default pair) with the flags applied."""
    if config is not None:
        cfg = load_config(config)
    elif small and large:
        cfg = DeploymentConfig(models=[ModelConfig(small), ModelConfig(large)])
    else:
        raise CliError("give --config FILE or both --small and --large")
    models = list(cfg.models)
    if config is not None and (small or large):
        names = [small or models[0].name, large or models[-1].name]
        models = [dataclasses.replace(m, name=n) for m, n in zip(models, names, strict=False)] + models[2:]
    if gpus:
        ids = [int(x) for x in gpus.split(",")]
        if len(ids) not in (1, len(models)):
            raise CliError(f"--gpus: give one GPU id or one per model ({len(models)})")
        models = [dataclasses.replace(m, gpus=[ids[min(i, len(ids) - 1)]]) for i, m in enumerate(models)]
    if no_cuda_graph:
        models = [dataclasses.replace(m, cuda_graphs=False) for m in models]
    rc = cfg.router
    if hop_rate is not None:
        check_prob(hop_rate, "--hop-rate")
    given = {"name": router, "hop_rate": hop_rate, "weights": router_model}
    rc = RouterConfig(**{**dataclasses.asdict(rc), **{k: v for k, v in given.items() if v is not None}})
    pc = cfg.policy
    if policy is not None or thresholds is not None:
        th = [int(x) for x in thresholds.split(",")] if thresholds else pc.thresholds
        pc = PolicyConfig(kind=policy or pc.kind, thresholds=th, table={} if thresholds else pc.table,
                          max_wait_ms=pc.max_wait_ms)  # fmt: skip
    sched = dataclasses.replace(cfg.scheduler, overlap=False) if no_overlap else cfg.scheduler
    if no_overlap:
        models = [dataclasses.replace(m, overlap=None) for m in models]
    place = dataclasses.replace(cfg.placement, mode=placement) if placement else cfg.placement
    return dataclasses.replace(cfg, models=models, router=rc, policy=pc, scheduler=sched, placement=place)


def serve(
    config: Annotated[Path | None, Opt("--config", help="Deployment YAML written by `trsim tune`.")] = None,
    small: Annotated[str | None, Opt(help="Small model: bundled name or HF directory.")] = None,
    large: Annotated[str | None, Opt(help="Large model: bundled name or HF directory.")] = None,
    device: Annotated[str, Opt(help="cpu or cuda.")] = "cuda",
    host: Annotated[str, Opt(help="Address the HTTP server binds.")] = "127.0.0.1",
    port: Annotated[int, Opt(help="HTTP port.")] = 8000,
    api_key: Annotated[str | None, Opt(help="Require this bearer key (401 without it; /health stays open).")] = None,
    router: Annotated[str | None, Opt(help="r2r | citer | co-llm | r-stitch | markov | me | trace.")] = None,
    router_model: Annotated[str | None, Opt(help="Learned router weights FILE, or 'random' (calibrated).")] = None,
    hop_rate: Annotated[float | None, Opt(help="Target hop rate.")] = None,
    policy: Annotated[str | None, Opt(help="step-sync | model-sync | eager | delayed.")] = None,
    thresholds: Annotated[str | None, Opt(help="Delayed thresholds B_i, comma-separated.")] = None,
    placement: Annotated[str | None, Opt(help="mps | separate.")] = None,
    gpus: Annotated[str | None, Opt(help="GPU id per model, comma-separated (one id: all on it).")] = None,
    no_cuda_graph: Annotated[bool, Opt("--no-cuda-graph", help="Run every step eagerly.")] = False,
    no_overlap: Annotated[bool, Opt("--no-overlap", help="No CPU-GPU overlap.")] = False,
    record_hops: Annotated[Path | None, Opt(help="Write the hop trace JSONL here on exit.")] = None,
    kv_tokens: Annotated[int, Opt(help="CPU only: KV capacity per model in tokens.")] = 8192,
    dry_run: Annotated[bool, Opt("--dry-run", help="Print the resolved deployment and exit.")] = False,
    # ---- context limit, supervision, shutdown, logs -----------------------------------------------------------
    max_model_len: Annotated[int | None, Opt(help="Longest request, prompt + max_tokens, in tokens (longer: 400); "
                             "also caps a max_tokens left out. Default: the models' position limit.")] = None,
    restart_on_failure: Annotated[bool, Opt("--restart-on-failure", help="Restart a subserver that dies, in "
                                  "place: requests in flight fail once, new ones get 503 until it is back. "
                                  "Without it the server exits non-zero for a supervisor to restart.")] = False,
    shutdown_timeout: Annotated[float, Opt(help="Seconds running requests get to finish on SIGTERM/SIGINT; "
                                "then they end with an error chunk.")] = 30.0,
    log_level: Annotated[str, Opt(help="debug | info | warning | error.")] = "info",
    no_access_log: Annotated[bool, Opt("--no-access-log", help="No log line per request.")] = False,
) -> None:  # fmt: skip
    """Serve a deployment: one process per model, OpenAI-compatible HTTP in front."""
    if device not in ("cpu", "cuda"):
        raise CliError(f"--device must be cpu or cuda, got {device!r}")
    from tokenrouter.runtime.logs import configure_logging

    try:
        configure_logging(log_level)
    except ValueError as e:
        raise CliError(f"--log-level: {e}") from None
    cfg = resolve(config, small, large, router, router_model, hop_rate, policy, thresholds, placement, gpus,
                  no_cuda_graph, no_overlap)  # fmt: skip
    cfg = _with_max_model_len(cfg, max_model_len)
    if restart_on_failure and cfg.policy.build().is_sync:
        raise CliError("--restart-on-failure needs an asynchronous policy (eager, delayed), not " + cfg.policy.kind)
    if shutdown_timeout < 0:
        raise CliError(f"--shutdown-timeout must be >= 0, got {shutdown_timeout}")
    from tokenrouter.runtime.launcher import Server, with_cpu_kv_tokens

    if device == "cpu":
        cfg = with_cpu_kv_tokens(cfg, kv_tokens)
    if dry_run:
        typer.echo(cfg.to_yaml().rstrip())
        return
    try:
        from tokenrouter.runtime.frontend import serve_http
    except ImportError as e:
        raise CliError(f"the HTTP front-end is not available (tokenrouter.runtime.frontend: {e})") from None
    tok = entry_tokenizer(cfg)
    Server.install_signal_handlers()
    # SIGINT/SIGTERM while starting: leave the `with`, which stops everything; once serving, serve_http drains.
    server = Server(cfg, device=device, record_hops=record_hops, restart_on_failure=restart_on_failure)
    with server, contextlib.suppress(KeyboardInterrupt):
        serve_http(server, host=host, port=port, api_key=api_key, tokenizer=tok, shutdown_timeout_s=shutdown_timeout,
                   access_log=not no_access_log, t0=server.t0)  # fmt: skip
    if server.failure is not None:  # a subserver died: exit non-zero so a supervisor restarts the server
        raise typer.Exit(1)


def _with_max_model_len(cfg: DeploymentConfig, max_model_len: int | None) -> DeploymentConfig:
    if max_model_len is None:
        return cfg
    if max_model_len < 2:
        raise CliError(f"--max-model-len must be >= 2, got {max_model_len}")
    return dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, max_model_len=max_model_len))


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
