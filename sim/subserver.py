"""One simpy process per subserver: it drives the shared core `Scheduler` exactly as the runtime loop does
(schedule -> launch -> complete -> deliver actions), with step time from the cost model instead of a GPU.

Time per step has two parts: host time (`host_ms`: forming the batch, post-processing the last one) and
device time (the cost model's step time plus the router's device part). Without overlap they add up: the
GPU idles while the host works. With overlap the host prepares step k+1 while step k runs, so the GPU runs
back to back, and two batches are in flight: k+1's sampling rows continue k's as `from_prev` rows, priced
like any row; a row whose request k sends away or finishes is computed and thrown away.

When to prepare k+1: as late as the host work allows, at (end of k) - host_ms, so that peers' returns that
land during step k still join k+1 instead of waiting a whole step (`core.overlap.prepare_time`). The runtime
applies the same rule to its estimate of k's end (`runtime.step_clock`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.messages import Action
from tokenrouter.core.overlap import prepare_time
from tokenrouter.core.scheduler import Scheduler

if TYPE_CHECKING:
    from tokenrouter.calibration.cost import ModelStepCost
    from tokenrouter.metrics import MetricsCollector


class SimSubserver:
    """Simulated subserver. `dispatch(model, actions)` delivers actions; `rematch` holds the request ids whose
    next row arrives as a new request (standard-serving mode) and pays the prefix re-match.

    Completions that land at the same instant are all processed before any subserver launches again
    (a zero-delay yield after each completion), which is also the Markov model's semantics.
    """

    def __init__(
        self,
        env: simpy.Environment,
        sched: Scheduler,
        *,
        cost: ModelStepCost,
        rule: GraphRule,
        host_ms: float,
        device_ms: float,
        metrics: MetricsCollector,
    ) -> None:
        self.env = env
        self.sched = sched
        self.model = sched.model
        self.cost = cost
        self.rule = rule
        self.host_s = host_ms / 1000.0
        self.device_ms = device_ms
        self.metrics = metrics
        self.overlap = sched.prepares_ahead
        self.dispatch: Callable[[int, list[Action]], None] = lambda model, actions: None
        self.colocated: list[SimSubserver] = []
        self.rematch: set[str] = set()
        self.running: deque[tuple[Batch, float, float]] = deque()  # (batch, start, end) in launch order
        self.busy_time = 0.0
        self.wasted_rows = 0
        self.rematch_rows = 0
        self._wake: simpy.Event | None = None
        self.proc = env.process(self._run())

    def kick(self) -> None:
        """Something changed (a message arrived, a peer finished): re-evaluate the launch decision."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        env, sched = self.env, self.sched
        while True:
            if not self.running:
                batch = sched.schedule(env.now)
                self.metrics.on_queue(self.model, env.now, len(sched.waiting))
                if batch is None:
                    yield from self._idle()
                    continue
                if self.host_s:  # nothing runs: the host's work is on the critical path
                    yield env.timeout(self.host_s)
                self._launch(batch, env.now)
                continue
            batch, start, end = self.running[0]
            if self.overlap and len(self.running) == 1:
                at = prepare_time(end, self.host_s)
                if env.now < at:
                    yield env.timeout(at - env.now)
                nxt = sched.schedule(env.now)
                if nxt is not None:  # the host works on it until now + host_s, while step k still runs
                    self._launch(nxt, max(env.now + self.host_s, end))
            if env.now < end:
                yield env.timeout(end - env.now)
            self.running.popleft()
            self.metrics.on_batch(self.model, start, end, len(batch.rows))
            # Rows whose request left (hop, finish) after the batch was prepared: computed, then thrown away.
            self.wasted_rows += sum(1 for r in batch.rows if r.version != r.req.version)
            actions = sched.complete(batch, StepResult([0] * len(batch.rows)), env.now)
            self.dispatch(self.model, actions)
            self.metrics.on_queue(self.model, env.now, len(sched.waiting))
            yield env.timeout(0)

    def _idle(self):
        self._wake = self.env.event()
        deadline = self.sched.next_deadline()
        if deadline is not None and deadline > self.env.now:
            yield self._wake | self.env.timeout(deadline - self.env.now)
        else:
            yield self._wake
        self._wake = None

    def _launch(self, batch: Batch, start: float) -> None:
        rematch = [i for i, r in enumerate(batch.rows) if not r.from_prev and r.req.rid in self.rematch]
        for i in rematch:
            self.rematch.discard(batch.rows[i].req.rid)
        self.rematch_rows += len(rematch)
        stats = StepStats.of_batch(batch, self.rule, rematch)
        alone = self.cost.step_ms(stats)
        # MPS: slowed down for the part of the step that overlaps a co-located model's step already running
        # (a step that starts later pays for the overlap itself).
        shared = max((e - start for p in self.colocated for _, s, e in p.running if s <= start < e), default=0.0)
        if shared > 0.0 and alone > 0.0:
            frac = min(1.0, shared * 1000.0 / alone)
            alone += frac * (self.cost.step_ms(stats, corunning=True) - alone)
        dur = (alone + self.device_ms) / 1000.0
        self.running.append((batch, start, start + dur))
        self.busy_time += dur
