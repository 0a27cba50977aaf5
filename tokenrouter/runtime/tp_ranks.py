"""The ranks of a tensor-parallel model (docs/tensor-parallel.md): rank 0 is the model's subserver process and
starts, feeds and supervises ranks 1..tp-1. Steps go over ZeroMQ PUSH (rank 0 never waits for a follower on the
host); a follower that exits while rank 0 serves calls `on_death`."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import zmq

from tokenrouter.core.kv import KVPool
from tokenrouter.runtime.supervision import describe_exit, report_failed, start_child

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # every rank of a model runs on rank 0's host


@dataclass(slots=True)
class FollowerSpec:
    """What rank `rank` needs (picklable: it crosses a multiprocessing spawn)."""

    rank: int
    size: int
    engine_kwargs: dict[str, Any]  # rank 0's `EngineConfig` keywords; `device` is this rank's
    num_pages: int | None  # rank 0's KV pool (None: the engine sizes it from the config, as rank 0 did)
    page_size: int
    store_port: int
    steps_address: str
    log_level: int = logging.WARNING
    timeout_s: float = 300.0


class TPRanks:
    """Rank 0's side and the engine's `StepSink`. Invariant: after `close()` returns, no follower process runs."""

    def __init__(self, size: int, engine_kwargs: dict[str, Any], *, num_pages: int | None = None,
                 on_death: Callable[[str], None] | None = None, log_level: int = logging.WARNING,
                 timeout_s: float = 300.0) -> None:  # fmt: skip
        # torch loads only in a process that runs a model: the launcher imports this module too.
        from tokenrouter.engine.config import EngineConfig
        from tokenrouter.engine.parallel import TensorParallel, serve_store

        if size < 2:
            raise ValueError(f"TPRanks needs tp >= 2, got {size}")
        self.size, self.on_death = size, on_death
        self.failure: str | None = None
        self._closing = threading.Event()
        self._closed = False
        device = EngineConfig(**engine_kwargs).torch_device()
        self._store = serve_store(size, HOST, timeout_s)
        self._ctx = zmq.Context()
        self._socks: list[zmq.Socket] = []
        self.procs: list[Any] = []
        try:
            ctx = mp.get_context("spawn")
            for r in range(1, size):
                s = self._ctx.socket(zmq.PUSH)
                s.setsockopt(zmq.SNDHWM, 0)
                s.setsockopt(zmq.LINGER, 0)
                port = s.bind_to_random_port(f"tcp://{HOST}")
                self._socks.append(s)
                dev = f"cuda:{(device.index or 0) + r}" if device.type == "cuda" else str(device)  # rank 0's GPU + r
                kw = {**engine_kwargs, "device": dev}
                spec = FollowerSpec(r, size, kw, num_pages, int(engine_kwargs.get("page_size", 16)), self._store.port,
                                    f"tcp://{HOST}:{port}", log_level, timeout_s)  # fmt: skip
                p = ctx.Process(target=follower_main, args=(spec,), name=f"tokenrouter-tp{r}", daemon=True)
                p.start()
                self.procs.append(p)
            self._watcher = threading.Thread(target=self._watch, name="tokenrouter-tp-watch", daemon=True)
            self._watcher.start()
            self.tp = TensorParallel.connect(0, size, HOST, self._store.port, device, store=self._store,
                                             timeout_s=timeout_s)  # fmt: skip
        except BaseException:
            self.close(timeout_s=0.0)
            raise

    def publish(self, data: bytes) -> None:
        for s in self._socks:
            s.send(data)

    def _watch(self) -> None:
        alive = {p.sentinel: (r, p) for r, p in enumerate(self.procs, start=1)}
        while alive and not self._closing.is_set():
            for sentinel in wait(list(alive), timeout=0.2):
                r, p = alive.pop(sentinel)
                p.join(5)  # the sentinel fires a moment before the child can be reaped
                if self._closing.is_set():
                    return
                msg = f"tensor-parallel rank {r} (pid {p.pid}) died ({describe_exit(p.exitcode)})"
                self.failure = self.failure or msg
                log.error("%s", msg)
                if self.on_death is not None:
                    self.on_death(msg)

    def await_death(self, timeout_s: float) -> None:
        """After a failed step, wait up to `timeout_s` for a follower to exit: a dead rank, not the failed collective,
        is the cause worth reporting (the watcher reports it and ends this process)."""
        live = [p.sentinel for p in self.procs if p.exitcode is None]
        # One already reaped may not be reported yet: wait for the watcher then too.
        died = len(live) < len(self.procs) or bool(live and wait(live, timeout=timeout_s))
        if died and self._watcher.is_alive():
            self._watcher.join(timeout_s + 5.0)  # it reaps (up to 5 s), reports, then `on_death` exits

    def close(self, timeout_s: float = 30.0) -> None:
        """Join the followers (the engine published `Stop` first), kill what is left, release sockets."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        # Join the watcher first: two threads in waitpid on one child race, and the loser reads no exit code.
        watcher = getattr(self, "_watcher", None)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(10)
        for p in self.procs:
            p.join(timeout_s)
        for p in self.procs:
            if p.exitcode is None:
                log.warning("tensor-parallel rank %s did not stop; killing it", p.name)
                p.kill()
                p.join(5)
        for s in self._socks:
            s.close(linger=0)
        self._socks = []
        self._ctx.term()


def follower_main(spec: FollowerSpec) -> None:
    """Process entry point of rank `spec.rank`. Exits 0 after `Stop`, 1 on an error."""
    start_child(spec.log_level)
    code = 0
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.connect(spec.steps_address)
    try:  # torch loads here: an import error is this rank's failure
        from tokenrouter.engine.config import EngineConfig
        from tokenrouter.engine.parallel import TensorParallel
        from tokenrouter.engine.runner import Engine
        from tokenrouter.engine.tp_step import follow

        cfg = EngineConfig(**spec.engine_kwargs)
        if cfg.torch_device().type == "cpu":
            import torch

            torch.set_num_threads(1)  # CPU ranks share the host's cores with rank 0: no oversubscription
        tp = TensorParallel.connect(spec.rank, spec.size, HOST, spec.store_port, cfg.torch_device(),
                                    timeout_s=spec.timeout_s)  # fmt: skip
        pool = KVPool(spec.num_pages, spec.page_size) if spec.num_pages is not None else None
        engine = Engine(cfg, kv_pool=pool, tp=tp)
        log.info("tensor-parallel rank %d of %d ready on %s (pid %d)", spec.rank, spec.size, engine.device,
                 os.getpid())  # fmt: skip
        follow(engine, sock.recv)
        engine.close()
    except BaseException as e:
        log.error("tensor-parallel rank %d: %s: %s", spec.rank, type(e).__name__, e)
        traceback.print_exc()
        code = 1
    sock.close(linger=0)
    ctx.term()
    # No interpreter shutdown: a process group's destructor after CUDA-graph capture can hang.
    os._exit(code)


def start_ranks(spec: Any, engine_kwargs: dict[str, Any], pool: Any) -> Any:
    """Rank 0's engine of subserver `spec` (`tp > 1`); a follower that dies from here on fails the subserver."""
    from tokenrouter.engine.config import EngineConfig
    from tokenrouter.engine.loader import resolve_spec
    from tokenrouter.engine.parallel import check_divides
    from tokenrouter.engine.runner import Engine

    size = spec.config.models[spec.model].tp
    cfg = EngineConfig(**engine_kwargs)  # a bad setting fails here, before any process starts
    check_divides(resolve_spec(cfg.model)[0], size)

    def on_death(why: str) -> None:
        try:
            report_failed(spec.addresses, spec.model, why)
        finally:
            os._exit(1)  # rank 0 may be blocked in a collective with the dead rank: no orderly shutdown

    ranks = TPRanks(size, engine_kwargs, num_pages=pool.num_pages, on_death=on_death, log_level=spec.log_level)
    try:
        return Engine(cfg, kv_pool=pool, tp=ranks.tp, followers=ranks)
    except BaseException:
        ranks.close(timeout_s=0.0)
        raise
