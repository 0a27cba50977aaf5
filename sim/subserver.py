"""One simpy process per subserver: it drives the shared core `Scheduler` exactly as the runtime loop
does (schedule -> run -> complete -> deliver actions), with step time from the cost model instead of a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import Action
from tokenrouter.core.scheduler import Scheduler

if TYPE_CHECKING:
    from tokenrouter.sim.metrics import MetricsCollector


class SimSubserver:
    """Simulated subserver. `step_ms(batch, corunning)` prices a batch; `dispatch` delivers actions.

    Completions that land at the same instant are all processed before any subserver launches again
    (a zero-delay yield after each completion), which is also the Markov model's semantics.
    """

    def __init__(
        self,
        env: simpy.Environment,
        sched: Scheduler,
        *,
        step_ms: Callable[[Batch, bool], float],
        overhead_ms: float,
        metrics: MetricsCollector,
    ) -> None:
        self.env = env
        self.sched = sched
        self.model = sched.model
        self.step_ms = step_ms
        self.overhead_ms = overhead_ms
        self.metrics = metrics
        self.dispatch: Callable[[list[Action]], None] = lambda actions: None
        self.colocated: list[SimSubserver] = []
        self.busy = False
        self.busy_time = 0.0
        self._wake: simpy.Event | None = None
        self.proc = env.process(self._run())

    def kick(self) -> None:
        """Something changed (a message arrived, a peer finished): re-evaluate the launch decision."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        env, sched = self.env, self.sched
        while True:
            batch = sched.schedule(env.now)
            self.metrics.on_queue(self.model, env.now, len(sched.waiting))
            if batch is None:
                self._wake = env.event()
                deadline = sched.next_deadline()
                if deadline is not None and deadline > env.now:
                    yield self._wake | env.timeout(deadline - env.now)
                else:
                    yield self._wake
                self._wake = None
                continue
            corunning = any(p.busy for p in self.colocated)
            dur = (self.step_ms(batch, corunning) + self.overhead_ms) / 1000.0
            start = env.now
            self.busy = True
            yield env.timeout(dur)
            self.busy = False
            self.busy_time += dur
            self.metrics.on_batch(self.model, start, env.now, len(batch.rows))
            actions = sched.complete(batch, StepResult([0] * len(batch.rows)), env.now)
            self.dispatch(actions)
            self.metrics.on_queue(self.model, env.now, len(sched.waiting))
            yield env.timeout(0)
