"""What the runtime's processes share to supervise one another (exits, `Failed` reports, a child's start, its
environment); low on purpose, so they import it and never each other for these."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import zmq

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime import rundir
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.logs import configure_logging
from tokenrouter.runtime.parent_watch import die_with_parent
from tokenrouter.runtime.sockets import send_once

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A subserver failed or timed out during start-up; the message names the model."""


def describe_exit(code: int | None) -> str:
    """`exit code 1`, `killed by SIGKILL`, ... from a multiprocessing exit code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def exit_reason(p: Any) -> str:
    """How a subserver's process (or a `runtime.remote` handle, which says it itself) ended."""
    return getattr(p, "exit_reason", None) or describe_exit(p.exitcode)


def report_failed(addresses: Addresses, model: int, msg: str) -> None:
    """`Failed` of model `model` to the front-end and the launcher, on fresh sockets."""
    ctx = zmq.Context()
    for addr in (addresses.frontend, addresses.launcher):
        if Addresses.known(addr):  # over tcp the front-end's port may not be published yet
            send_once(ctx, addr, [P.CTL, P.encode(P.Failed(model, msg))])
    ctx.term()


def fail_and_exit(addresses: Addresses, model: int, exc: BaseException,
                  send_control: Callable[[P.Failed], None] | None) -> NoReturn:  # fmt: skip
    """A subserver-like process died: log it, send `Failed` (through `send_control`, or fresh sockets when None), and
    `os._exit(1)` (no finalizer may hang a dead process)."""
    msg = f"{type(exc).__name__}: {exc}"
    log.error("model %d: %s", model, msg)
    # In start-up (no control sockets yet) the launcher reports it in one line: the traceback is for debugging.
    log.log(logging.ERROR if send_control is not None else logging.DEBUG, "model %d: traceback", model, exc_info=True)
    try:
        if send_control is not None:
            send_control(P.Failed(model, msg))
        else:
            report_failed(addresses, model, msg)
    finally:
        os._exit(1)


def start_child(log_level: int, run_dir: str | None = None) -> None:
    """Call first in a spawned child: log at `log_level` and die with its parent (removing an orphaned `run_dir`)."""
    configure_logging(log_level)
    parent = mp.parent_process()

    def on_orphan() -> None:
        if run_dir and rundir.owner_gone(Path(run_dir)):
            rundir.remove(Path(run_dir))

    die_with_parent(parent.pid if parent is not None else os.getppid(), on_orphan)


@contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """Set variables for the duration of a `with`, then restore them. Not thread-safe."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
