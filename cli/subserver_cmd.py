"""`tokenrouter subserver`: one model's subserver (`external: true`) for a launcher on another host (docs/cluster.md);
it serves until the launcher sends Shutdown or the connection drops."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from tokenrouter.cli.common import CliError, require_extras

Opt = typer.Option


def subserver(
    config: Annotated[Path, Opt(help="The deployment YAML the launcher serves (the same file).")],
    model: Annotated[str, Opt(help="The model to run: its name in the config, or its index.")],
    join: Annotated[str, Opt(help="The launcher's address, tcp://HOST:PORT (its log prints the command to run).")],
    advertise: Annotated[
        str | None,
        Opt(help="The address the other processes reach this host at. Default: the model's `host` in the config, "
            "else this host's address on the route to the launcher."),
    ] = None,
    join_timeout: Annotated[float, Opt(help="Seconds to wait for the launcher's answer.")] = 600.0,
    log_level: Annotated[str, Opt(help="debug | info | warning | error.")] = "info",
) -> None:  # fmt: skip
    """Run one model's subserver here and join a launcher on another host (a model with external: true)."""
    from tokenrouter.core.config import load_config

    require_extras("subserver", ("serve", "engine"))
    from tokenrouter.runtime.addresses import SUBSERVER_OFFSET, Addresses, route_address, split_tcp, tcp_endpoint
    from tokenrouter.runtime.build import SubserverSpec

    cfg = load_config(config)  # a ConfigError is a user error: one line, exit 2 (`run_app`)
    names = [m.name for m in cfg.models]
    i = _model_index(model, names)
    mc = cfg.models[i]
    if not mc.external:
        raise CliError(f"model {mc.name} is started by its launcher (external: false in {config}); mark it "
                       "external: true there to start it by hand")  # fmt: skip
    if "://" not in join:
        join = "tcp://" + join
    try:
        launcher_host, _ = split_tcp(join)
    except ValueError as e:
        raise CliError(f"--join: {e}") from None
    try:
        host = advertise or mc.host or route_address(launcher_host)
    except OSError as e:
        raise CliError(f"{e}: give --advertise") from None
    port = 0 if cfg.placement.port_base is None else cfg.placement.port_base + SUBSERVER_OFFSET + i
    subs = tuple(tcp_endpoint(host, port) if j == i else "" for j in range(len(names)))
    addrs = Addresses(frontend="", subservers=subs, coordinator="", launcher=join)

    from tokenrouter.runtime.logs import configure_logging

    try:
        configure_logging(log_level)
    except ValueError as e:
        raise CliError(f"--log-level: {e}") from None
    from tokenrouter.runtime.join import JoinRefused, join_launcher
    from tokenrouter.runtime.launcher import Server

    Server.install_signal_handlers()  # SIGTERM as Ctrl-C: the subserver reports Failed and exits
    try:
        joined = join_launcher(addrs, i, mc.name, external=True, models=names, timeout_s=join_timeout)
    except (JoinRefused, TimeoutError) as e:
        raise CliError(str(e)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if joined is None:
        return
    spec = SubserverSpec.from_welcome(i, joined.welcome, logging.getLogger("tokenrouter").getEffectiveLevel())
    if spec.device == "cuda" and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.config.models[i].gpus)
    from tokenrouter.runtime.subserver import serve

    serve(spec, joined, watch_launcher=True)


def _model_index(model: str, names: list[str]) -> int:
    if model.isdigit() and int(model) < len(names):
        return int(model)
    hits = [k for k, n in enumerate(names) if n == model]
    if len(hits) != 1:
        raise CliError(f"--model {model!r}: the config's models are {', '.join(names)} (a name once, or an index)")
    return hits[0]
