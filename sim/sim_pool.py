"""Simulator runs spread over processes. A tune's candidate checks are independent runs, each of one seeded config,
so they give the same numbers in any order and on any number of cores; on a laptop the cores cut a
many-placement `trsim tune` by about their number."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def sim_pool(jobs: int) -> Iterator[Executor | None]:
    """A pool of `jobs` worker processes (0: one per core), or None for one job (the runs stay in this process).
    The workers ignore Ctrl-C: the command's own process takes it, drops the runs not yet started and waits for
    those under way. ValueError (one line, naming --jobs) for a negative `jobs`."""
    if jobs < 0:
        raise ValueError(f"--jobs must be >= 0 (0: one per core), got {jobs}")
    jobs = jobs or available_cores()
    if jobs <= 1:
        yield None
        return
    # spawn, not fork: the command may hold threads (a progress bar's) that a forked child would inherit stopped
    pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_ignore_sigint)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
