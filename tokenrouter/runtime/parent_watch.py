"""A subserver dies with the server that started it, however the server ends (`kill -9` and OOM kills
included), and removes the server's run directory on its way out.

Two mechanisms, so neither a race nor a platform leaves an orphan: Linux's `PR_SET_PDEATHSIG` (sent when the
*thread* that created us exits, so the handler acts only once the parent pid changed) and a daemon thread polling
`os.getppid()`. SIGINT/SIGTERM sent to the whole process group are ignored while the parent lives: the server
stops its subservers itself.
"""

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
    """A `preexec_fn` for `subprocess.Popen`: the child (a whole `tr serve`, started by a test or a study) gets
    SIGTERM, and so drains and stops its subservers, when the process that started it ends however it ends
    (`timeout`'s SIGTERM or a SIGKILL included). Linux only; elsewhere a no-op."""
    _set_pdeathsig(signal.SIGTERM)


def die_with_parent(parent_pid: int, on_orphan: Callable[[], None], poll_s: float = 0.25) -> None:
    """Call once, early, in the child. When `parent_pid` is no longer our parent: `on_orphan()` (best effort),
    then exit at once (no Python shutdown: the sockets' peers are gone and a flush could block)."""
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
    # A child of `runtime.spawn.start_spawned` starts with SIGINT blocked (no KeyboardInterrupt while it imports):
    # from here on the handler above takes it (one that came meanwhile is delivered now).
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
