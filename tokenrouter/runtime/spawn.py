"""Start a spawned child that imports only what it runs (`__main__`, our CLI, is hidden meanwhile) and starts with
SIGINT blocked (inherited) until `parent_watch.die_with_parent` unblocks it: no traceback from a Ctrl-C in torch's
import."""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from typing import Any

from tokenrouter.runtime.supervision import environ

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


def start_spawned(target: Callable[..., Any], args: tuple[Any, ...], *, name: str | None = None,
                  daemon: bool = False, env: dict[str, str] | None = None,
                  started: Callable[[BaseProcess], None] | None = None) -> BaseProcess:  # fmt: skip
    """Start `target(*args)` with `env` added. `started(process)` runs while SIGINT is still blocked, so a Ctrl-C
    raises only after the caller recorded the process. Not thread-safe (swaps `__main__` and `os.environ`)."""
    ctx = mp.get_context("spawn")
    resource_tracker.ensure_running()  # its start unblocks SIGINT: before the block
    with environ(env or {}), _main_hidden(), _sigint_blocked():
        proc = ctx.Process(target=target, args=args, name=name, daemon=daemon)
        proc.start()
        if started is not None:
            started(proc)
    return proc


@contextmanager
def _main_hidden() -> Iterator[None]:
    """spawn reads `sys.modules["__main__"]` to tell the child what to run again: a bare module tells it nothing."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread (the child inherits the mask) and, in the main thread, SIGINT/SIGTERM only
    noted until the block ends, then raised again: not lost, and never raised between the child's start and
    `started`. The mask alone does not hold: a process-directed signal goes to any thread that does not block it
    (OpenBLAS's pool, started by numpy's import), and Python then runs the handler in the main thread anyway."""
    noted: list[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():  # signal.signal works there only; nor do handlers
        mine = [s for s in _DEFERRED if signal.getsignal(s) is not None]  # None: a handler from C, left alone
        handlers = {s: signal.signal(s, lambda signum, _frame: noted.append(signum)) for s in mine}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a SIGINT held by the mask runs the noting handler here
        for s, h in handlers.items():
            signal.signal(s, h)
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)  # its own handler now: KeyboardInterrupt, or what the caller installed
