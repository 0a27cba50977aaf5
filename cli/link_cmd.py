"""`tokenrouter link-probe`: the far end of `tokenrouter calibrate --link` (`calibration.profiler.link`,
docs/cluster.md): echoes small messages and acknowledges large ones over ZeroMQ tcp until Ctrl-C or SIGTERM."""

from __future__ import annotations

from typing import Annotated

import typer

from tokenrouter.cli.common import CliError, require_extras


def link_probe(
    listen: Annotated[str, typer.Option(help="Where to listen: :PORT (every interface) or ADDRESS:PORT.")],
) -> None:
    """Answer `tokenrouter calibrate --link` from another host: measures the tcp link between the two."""
    require_extras("link-probe", ("serve",), ("zmq",))
    from tokenrouter.calibration.profiler.link import probe_address, serve_probe

    try:
        bind, _ = probe_address(listen)
    except ValueError as e:
        raise CliError(f"--listen: {e}") from None
    from tokenrouter.runtime.launcher import Server

    Server.install_signal_handlers()  # SIGTERM as Ctrl-C
    # :PORT binds every interface (the far end of a link is another host); said, since anyone who reaches this
    # host can then talk to the probe
    every = " on every interface (any host that reaches this one can connect; ADDRESS:PORT binds one)"
    where = every if bind.startswith("tcp://*:") else ""
    try:
        serve_probe(bind, on_ready=lambda ep: typer.echo(f"link-probe listening on {ep}{where} (Ctrl-C stops it)"))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # zmq.ZMQError: the port is taken, an address not of this host
        raise CliError(f"--listen {listen}: {e}") from None
