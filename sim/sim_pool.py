"""Simulator runs spread over processes: seeded independent runs give the same numbers in any order and on any
number of cores. Workers are forked where the OS can (Linux) and no other thread runs yet (a fork inherits the
imports, and a thread stopped with whatever lock it held); elsewhere they are spawned.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def sim_pool(jobs: int) -> Iterator[Executor | None]:
    """A pool of `jobs` worker processes (0: one per core), already started, or None for one job. The workers ignore
    Ctrl-C: the command's process takes it, drops the runs not yet started and waits for those under way."""
    if jobs < 0:
        raise ValueError(f"--jobs must be >= 0 (0: one per core), got {jobs}")
    jobs = jobs or available_cores()
    if jobs <= 1:
        yield None
        return
    fork = sys.platform.startswith("linux") and threading.active_count() == 1
    pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork" if fork else "spawn"), initializer=_ignore_sigint)
    try:
        # Start every worker now (a forking pool starts them all at its first task), before any progress thread.
        list(pool.map(_nothing, range(jobs)))
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _nothing(_: int) -> None:
    return None
