"""A subserver dies with the server that started it, however the server ends (docs/runtime.md, "Supervision"):
Linux's `PR_SET_PDEATHSIG` (sent when the creating *thread* exits, so the handler checks the parent pid) plus a
thread polling `os.getppid()`. Group-wide SIGINT/SIGTERM are ignored while the parent lives."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def term_when_parent_dies() -> None:
    """A `preexec_fn`: the child gets SIGTERM (and drains) when its starter ends however it ends (Linux only)."""
    _set_pdeathsig(signal.SIGTERM)


def die_with_parent(parent_pid: int, on_orphan: Callable[[], None], poll_s: float = 0.25) -> None:
    """Call once, early, in the child: once `parent_pid` is not our parent, `on_orphan()`, then exit at once."""
    done = threading.Lock()

    def orphaned() -> None:
        if not done.acquire(blocking=False):
            return
        try:
            log.warning("the server process (pid %d) is gone: exiting", parent_pid)
            on_orphan()
        finally:
            os._exit(1)

    def on_signal(signum: int, frame: object) -> None:
        if os.getppid() != parent_pid:
            orphaned()
        # else: a signal for the whole group, or the creating thread ended; the parent decides when we stop

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # A child of `runtime.spawn.start_spawned` starts with SIGINT blocked: the handler above takes it from here on.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != parent_pid:  # it died before the prctl took effect
        orphaned()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent_pid:
                orphaned()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
