"""`EngineLoop`: the one loop that drives an engine from a core `Scheduler` (docs/runtime.md, "The subserver
loop"). The subserver (ZeroMQ) and `local_loop` (in process) differ only in `receive`, `wait_idle` and `deliver`.
The loop waits on each step's own handle, never on the device, and never frees KV itself."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import Action
from tokenrouter.core.overlap import PREPARE_POLL_S, StepClock, prepare_time
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.engine.errors import BatchError, StepFailed
from tokenrouter.runtime.logs import JsonlLog
from tokenrouter.runtime.stats import Counters
from tokenrouter.steplog import step_record

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InFlight:
    """A launched step the loop has not completed yet."""

    batch: Batch
    handle: Any  # the engine's StepHandle: ready(), result(), gpu_start / gpu_end events (CUDA timing)
    launched: float  # monotonic clock
    back_to_back: bool  # launched without the loop waiting for work since the previous completion
    submitted: float | None = None  # handed to the engine (before its planning): `Counters.batches` starts here


@dataclass(slots=True)
class LoopTimes:
    """Host seconds spent in each part of the loop (studies: where the time per step goes)."""

    schedule_s: float = 0.0
    step_s: float = 0.0  # inside engine.step (plan + launch)
    wait_s: float = 0.0  # blocked on step handles
    complete_s: float = 0.0  # Scheduler.complete + deliver
    wall_s: float = 0.0  # inside run()


class EngineLoop(ABC):
    """Invariant: `inflight` lists the launched steps in launch order, the same batches as `sched.inflight` (taken
    off both at once, in `complete_oldest`); at most two are in flight, one without overlap."""

    def __init__(self, engine: Any, sched: Scheduler, *, prepare_margin_s: float = 0.001,
                 step_log: JsonlLog | None = None, keep_handles: bool = False) -> None:  # fmt: skip
        self.engine, self.sched, self.model = engine, sched, sched.model
        self.margin_s = prepare_margin_s
        self.step_log = step_log if step_log is not None else JsonlLog(None)
        self.keep_handles = keep_handles
        self.handles: list[Any] = []  # every launched step's handle, with keep_handles (tests, studies)
        self.inflight: deque[InFlight] = deque()
        self.counters = Counters()
        self.times = LoopTimes()
        self.clock = StepClock()
        self.launched = 0
        self.stopping = False
        self.idled = True  # the loop waited for work since the last launch: the next step is not back to back
        self.last_done: float | None = None
        # GPU time per step (two CUDA events) for the step clock and the loop counters; nothing to time on CPU.
        engine.timing = engine.device.type == "cuda"

    @abstractmethod
    def receive(self, timeout_s: float) -> None:
        """Handle every queued message, delivering what the scheduler returns; wait up to `timeout_s` for one."""

    @abstractmethod
    def wait_idle(self) -> None:
        """Nothing in flight, nothing launched: block until a message or `sched.next_deadline()`, or set `stopping`."""

    @abstractmethod
    def deliver(self, actions: list[Action], failed: frozenset[str] = frozenset()) -> None:
        """Send `actions`; a Finish of a request in `failed` reports reason "error" (its step failed)."""

    def before_complete(self, batch: Batch) -> None:  # noqa: B027 - optional hook, default no-op
        """A step's result is in, before `Scheduler.complete` may release pages (a prefix cache takes them here)."""

    def after_schedule(self, batch: Batch | None) -> None:  # noqa: B027 - optional hook, default no-op
        """Right after `schedule`, before the step launches (a sync gate hands back an unused grant here)."""

    def run(self, max_steps: int | None = None) -> None:
        """Serve until `stopping` (or `max_steps` launches), then complete what is in flight."""
        t_run = time.perf_counter()
        busy = True  # try to schedule before the first wait
        while not self.stopping and (max_steps is None or self.launched < max_steps):
            if busy or self.inflight:
                self.receive(0.0)
            else:
                self.idled = True
                self.wait_idle()
            self.wait_to_prepare()
            if self.stopping:
                break
            launched = self.launch()
            completed = False
            while self.inflight and (not self.sched.prepares_ahead or not launched or len(self.inflight) > 1):
                self.complete_oldest()
                completed = True
            busy = launched or completed or bool(self.inflight)  # a completion may make us launchable: no block yet
        while self.inflight:
            self.complete_oldest()
        self.times.wall_s += time.perf_counter() - t_run

    def wait_to_prepare(self) -> None:
        """Overlap: take messages until `prepare_margin_s` before step k's estimated end, or until k is done."""
        if not self.sched.prepares_ahead or len(self.inflight) != 1 or self.clock.end is None:
            return
        handle = self.inflight[0].handle
        at = prepare_time(self.clock.end, self.margin_s)
        while not self.stopping and not handle.ready():
            left = at - time.monotonic()
            if left <= 0:
                return
            self.receive(min(PREPARE_POLL_S, left))  # slices: notice an early end of k soon enough

    def launch(self) -> bool:
        """Schedule and launch one step; False when `schedule` formed nothing."""
        t0 = time.perf_counter()
        batch = self.sched.schedule(time.monotonic())
        self.times.schedule_s += time.perf_counter() - t0
        self.after_schedule(batch)
        if batch is None:
            return False
        t0 = time.perf_counter()
        submitted = time.monotonic()
        handle = self.step_engine(batch)
        if handle is None:
            return True
        self.times.step_s += time.perf_counter() - t0
        t = time.monotonic()
        self.clock.on_launch(t)
        self.inflight.append(InFlight(batch, handle, t, not self.idled, submitted))
        self.idled = False
        self.launched += 1
        if self.keep_handles:
            self.handles.append(handle)
        return True

    def step_engine(self, batch: Batch) -> Any | None:
        """`engine.step(batch)`, or None when the batch failed. A BatchError naming requests fails only those and
        steps the batch again (their rows are stale now; each retry drops a live row, so it ends)."""
        r = self.sched.router
        while True:
            try:
                return self.engine.step(batch, return_logits=r.needs_logits, return_hidden=r.needs_hidden)
            except StepFailed as e:
                self.fail_batch(batch, str(e))
                return None
            except BatchError as e:
                if not self.fail_rows(batch, e):
                    self.fail_batch(batch, f"step {batch.step_id} refused: {e}")
                    return None

    def fail_rows(self, batch: Batch, err: BatchError) -> bool:
        """End the requests `err` names with "error" (as an abort); False when it names no live row of the batch."""
        named = set(err.rids)
        rids = frozenset(row.req.rid for row in batch.rows if row.req.rid in named and row.version == row.req.version)
        if not rids:
            return False
        now = time.monotonic()
        acts: list[Action] = []
        for rid in sorted(rids):
            log.warning("model %d: request %s fails (error), step %d runs without it: %s", self.model, rid,
                        batch.step_id, err)  # fmt: skip
            acts += self.sched.abort(rid, now)
        self.deliver(acts, rids)
        # An abort that did not take (the core no longer knows the request) would make the retry loop forever.
        return all(row.version != row.req.version for row in batch.rows if row.req.rid in rids)

    def fail_batch(self, batch: Batch, why: str) -> None:
        """A launch failed: its requests end with "error"; the loop goes on. The core completes in launch order,
        so a step still in flight before it is completed first (its results are good)."""
        rids = frozenset(row.req.rid for row in batch.rows)
        log.warning("model %d: step %d fails with its %d requests (error): %s", self.model, batch.step_id, len(rids),
                    why)  # fmt: skip
        while self.inflight:
            self.complete_oldest()
        acts: list[Action] = []
        for rid in rids:
            acts += self.sched.abort(rid, time.monotonic())
        # Every row is now stale, so completing the batch only takes it off the in-flight list.
        acts += self.sched.complete(batch, StepResult(next_token_ids=[-1] * len(batch.rows)), time.monotonic())
        self.deliver(acts, rids)

    def complete_oldest(self) -> None:
        f = self.inflight.popleft()
        t0 = time.perf_counter()
        res = f.handle.result()
        t_done = time.monotonic()
        self.times.wait_s += time.perf_counter() - t0
        rows = len(f.batch.rows)
        self.counters.step(rows, f.launched, t_done, f.submitted)
        h = f.handle
        gpu_ms = h.gpu_start.elapsed_time(h.gpu_end) if getattr(h, "gpu_start", None) is not None else 0.0
        self.clock.on_gpu_time(gpu_ms / 1000.0)
        self.clock.on_complete(t_done, bool(self.inflight))
        if f.back_to_back and self.last_done is not None:
            self.counters.loop_step(rows, t_done - self.last_done, gpu_ms)
        self.last_done = t_done
        if self.step_log.enabled:
            self.step_log.write(step_record(self.model, f.batch, launch=f.launched, done=t_done, gpu_ms=gpu_ms,
                                            back_to_back=f.back_to_back, submitted=f.submitted,
                                            graph=getattr(h, "graph_bucket", None),
                                            varlen=getattr(h, "varlen_bucket", None)))  # fmt: skip
        t0 = time.perf_counter()
        self.before_complete(f.batch)
        self.deliver(self.sched.complete(f.batch, res, t_done))
        self.times.complete_s += time.perf_counter() - t0
