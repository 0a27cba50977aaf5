"""Start a spawned child process that imports only what it runs and is deaf to Ctrl-C while it starts.

- Spawn runs the parent's `__main__` again in the child; ours is a console script whose CLI imports the simulator,
  scipy and pandas. While the child starts, `__main__` is hidden (a bare module stands in), so the child imports
  only the target's module.
- A terminal's Ctrl-C signals the whole process group, and a child still importing torch would print a traceback.
  SIGINT is blocked in the calling thread while the child is created; the mask is inherited, so the child starts
  with SIGINT blocked until it unblocks it itself (`parent_watch.die_with_parent`).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from typing import Any

from tokenrouter.runtime.supervision import environ


def start_spawned(target: Callable[..., Any], args: tuple[Any, ...], *, name: str | None = None,
                  daemon: bool = False, env: dict[str, str] | None = None,
                  started: Callable[[BaseProcess], None] | None = None) -> BaseProcess:  # fmt: skip
    """Start `target(*args)` in a spawned process (module docstring), with `env` added to the environment it copies.
    `started(process)` runs while SIGINT is still blocked here: a Ctrl-C that came during the start raises only
    after the caller has recorded the process (to stop it), never between the start and the record. Not thread-safe
    with other code that swaps `sys.modules["__main__"]` or `os.environ`."""
    ctx = mp.get_context("spawn")
    # Starting multiprocessing's resource tracker (the first spawn does) ends with SIGINT unblocked, whatever the
    # mask was: start it before the block, so the start below finds it running.
    resource_tracker.ensure_running()
    with environ(env or {}), _main_hidden(), _sigint_blocked():
        proc = ctx.Process(target=target, args=args, name=name, daemon=daemon)
        proc.start()
        if started is not None:
            started(proc)
    return proc


@contextmanager
def _main_hidden() -> Iterator[None]:
    """spawn reads `sys.modules["__main__"]` to tell the child what to run again: a module without a file or a
    spec tells it nothing."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread; one that arrives meanwhile is delivered when the block ends, not lost."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
