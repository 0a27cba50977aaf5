"""One simpy process per subserver: it drives the shared core `Scheduler` exactly as the runtime loop does
(schedule -> launch -> complete -> deliver actions), with step time from the cost model instead of a GPU.

Time per step is host time (`host_ms(rows)`) plus device time (the cost model's pass time plus the router's device
part); without overlap they add up, with it the host prepares step k+1 while step k runs, as late as
`core.overlap.prepare_time` allows (docs/simulator.md#overlap). Device time is shared: a pass runs on its GPU
(`gpu_share.SharedGpu`) at a rate that changes whenever a co-located model starts or ends a pass, so the
subserver re-times its wait when told to.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.core.autotune_counters import BatchTimes
from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.messages import Action
from tokenrouter.core.overlap import PREPARE_POLL_S, StepClock, prepare_time
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.sim.gpu_share import GpuPass, SharedGpu
from tokenrouter.steplog import step_record

EPS_S = 1e-9  # a nanosecond: below it a wait is done (float time must not spin on vanishing remainders)

if TYPE_CHECKING:
    from tokenrouter.calibration.cost import ModelStepCost
    from tokenrouter.metrics import MetricsCollector


@dataclass(slots=True, eq=False)
class _InFlight:
    batch: Batch
    gpu: GpuPass
    ready_s: float  # host work done: the pass may start on the GPU from here
    started_s: float | None = None
    ended_s: float | None = None  # when the pass finished on the GPU (the loop may notice later)
    next_formed: bool = False  # overlap: the step after this one was formed (once per step, as the runtime does)
    formed_s: float = 0.0  # when the scheduler formed the batch (the runtime's `submitted`)
    ahead: bool = False  # formed while the step before it ran (the runtime's `back_to_back`)


class SimSubserver:
    """Simulated subserver. `dispatch(model, actions)` delivers actions; `rematch` holds the request ids whose
    next row arrives as a new request (standard-serving mode) and pays the prefix re-match.

    Completions that land at the same instant are all processed before any subserver launches again
    (a zero-delay yield after each completion), which is also the Markov model's semantics.

    `gpu`: the GPU this model's passes run on (shared with co-located models); `gate_ms`: sync policies'
    coordinator time per step (on the critical path: sync policies never overlap); `overlap_frac`: with
    overlap, the loop's own time per step as a fraction of the pass (what the host did not hide);
    `prepare_margin_ms`: how long before a step's end the next one is formed (default: its host time).
    """

    def __init__(
        self,
        env: simpy.Environment,
        sched: Scheduler,
        *,
        cost: ModelStepCost,
        rule: GraphRule,
        metrics: MetricsCollector,
        gpu: SharedGpu,
        host_ms: Callable[[int], float] | float = 0.0,
        device_ms: Callable[[int], float] | float = 0.0,
        gate_ms: float = 0.0,
        overlap_frac: float = 0.0,
        prepare_margin_ms: float | None = None,
    ) -> None:
        self.env = env
        self.sched = sched
        self.model = sched.model
        self.cost = cost
        self.rule = rule
        self.metrics = metrics
        self.gpu = gpu
        self.host_ms = host_ms if callable(host_ms) else (lambda rows, _h=float(host_ms): _h)
        self.device_ms = device_ms if callable(device_ms) else (lambda rows, _d=float(device_ms): _d)
        self.gate_s = gate_ms / 1000.0
        self.overlap_frac = overlap_frac
        self.margin_ms = prepare_margin_ms
        self.overlap = sched.prepares_ahead
        self.dispatch: Callable[[int, list[Action]], None] = lambda model, actions: None
        self.rematch: set[str] = set()
        self.inflight: deque[_InFlight] = deque()  # launch order; only the head executes on the GPU
        self.wasted_rows = 0
        self.rematch_rows = 0
        # The counters a runtime subserver exports (`runtime.stats.Counters`), for autotune: steps per batch size
        # with their own busy time (from the pass's start on the GPU, as the runtime times from its launch),
        # committed tokens this model wrote and hand-offs it sent (the driver's `_Links` counts those two).
        self.batches = BatchTimes()
        self.tokens = 0
        self.hops = 0
        self._busy_until = float("-inf")
        self._wake: simpy.Event | None = None
        self._waiting: tuple[simpy.Process, float, float] | None = None  # a `_wait`: (process, wake time, lead)
        # Overlap: when step k ends, as the runtime estimates it (its `StepClock`: a moving average of GPU times),
        # and when the loop next looks at k's handle while it waits for the prepare time (PREPARE_POLL_S slices)
        self.clock = StepClock()
        self._poll_at: float | None = None
        self._polling = False
        self.step_log: list[dict] | None = None  # a list: every completed step's record (`tokenrouter.steplog`)
        self.proc = env.process(self._run())

    def kick(self) -> None:
        """Something changed (a message arrived, a peer finished): re-evaluate the launch decision."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self._polling and self._waiting is not None:  # a message ends the runtime's receive: it looks at k
            w, self._waiting = self._waiting, None
            self._poll_at = self.env.now
            w[0].interrupt()

    def retime(self) -> None:
        """The running pass changed rate (a co-located pass started or ended): re-time the wait for its end.

        Only a wait that would now end too late is cut short (an interrupt): one that ends too early wakes, finds
        work left and waits again, which costs less than waking every wait on every rate change."""
        w = self._waiting
        if w is not None and self.inflight:
            target = self.env.now + self.inflight[0].gpu.remaining_s(self.env.now) - w[2]
            if target < w[1] - EPS_S:
                self._waiting = None
                w[0].interrupt()

    def _run(self):
        env, sched, inflight = self.env, self.sched, self.inflight
        while True:
            now = env.now
            if not inflight:
                batch = sched.schedule(now)
                self.metrics.on_queue(self.model, now, len(sched.waiting))
                if batch is None:
                    yield from self._idle()
                    continue
                # Nothing runs: the host's work (and a sync policy's coordinator time) is on the critical path.
                host_s = self.host_ms(len(batch.rows)) / 1000.0 + self.gate_s
                inflight.append(self._prepare(batch, now + host_s))
                self.clock.on_launch(now + host_s)
                continue
            head = inflight[0]
            if head.started_s is None:  # a prepared pass whose host work is not done yet (nothing else runs)
                yield env.timeout(max(0.0, head.ready_s - now))
                self._start(head)
                continue
            wait = lead = 0.0
            if head.ended_s is None and head.gpu.remaining_s(now) <= EPS_S:
                self._gpu_end(head)
            if self.overlap and len(inflight) == 1 and not head.next_formed:
                margin = self.margin_ms if self.margin_ms is not None else self.host_ms(len(head.batch.rows))
                # The runtime forms k+1 at its estimate of k's end less the margin (at once without an estimate),
                # or when it sees k done: at the end of a 2 ms wait, or when a message comes.
                at = now if self.clock.end is None else prepare_time(self.clock.end, margin / 1000.0)
                if self._poll_at is None:
                    self._poll_at = now + PREPARE_POLL_S
                elif self._poll_at <= now + EPS_S:
                    if head.ended_s is not None:
                        at = now
                    else:
                        self._poll_at = now + PREPARE_POLL_S
                if at - now > EPS_S:
                    target = min(at, self._poll_at)
                    if head.ended_s is None:
                        target = min(target, now + head.gpu.remaining_s(now))
                    self._waiting = (self.proc, target, 0.0)
                    self._polling = True
                    with contextlib.suppress(simpy.Interrupt):
                        yield env.timeout(max(0.0, target - now))
                    self._polling = False
                    self._waiting = None
                    continue
                self._poll_at = None
                head.next_formed = True
                nxt = sched.schedule(now)
                if nxt is not None:  # the host works on it until now + host time, while step k still runs
                    ready = now + self.host_ms(len(nxt.rows)) / 1000.0
                    f = self._prepare(nxt, ready)
                    f.ahead = True
                    inflight.append(f)
                    self.clock.on_launch(ready)
            if not wait:
                left = 0.0 if head.ended_s is not None else head.gpu.remaining_s(now)
                wait = left if left > EPS_S else 0.0
            if wait:
                # Sleep, or less when the running pass is re-timed so that the wait's target (`lead` before the
                # pass's end) comes sooner (`retime`).
                self._waiting = (self.proc, now + wait, lead)
                with contextlib.suppress(simpy.Interrupt):
                    yield env.timeout(wait)
                self._waiting = None
                continue
            self._complete(head)
            if inflight and inflight[0].started_s is None and inflight[0].ready_s <= now:
                self._start(inflight[0])  # the prepared step follows at once (before the zero-delay yield)
            if env.peek() == now:  # other events at this instant (completions) go first; none: nothing to wait for
                yield env.timeout(0)

    def _idle(self):
        self._wake = self.env.event()
        deadline = self.sched.next_deadline()
        if deadline is not None and deadline > self.env.now:
            yield self._wake | self.env.timeout(deadline - self.env.now)
        else:
            yield self._wake
        self._wake = None

    def _prepare(self, batch: Batch, ready_s: float) -> _InFlight:
        rematch = [i for i, r in enumerate(batch.rows) if not r.from_prev and r.req.rid in self.rematch]
        for i in rematch:
            self.rematch.discard(batch.rows[i].req.rid)
        self.rematch_rows += len(rematch)
        stats = StepStats.of_batch(batch, self.rule, rematch)
        rows = len(batch.rows)
        work = self.cost.step_ms(stats) + self.device_ms(rows)
        if self.overlap:
            work *= 1.0 + self.overlap_frac
        tokens = stats.graph.tokens + stats.eager.tokens
        return _InFlight(batch, GpuPass(self.model, tokens, work, self.retime), ready_s, formed_s=self.env.now)

    def _start(self, f: _InFlight) -> None:
        f.started_s = self.env.now
        self.gpu.start(f.gpu, self.env.now)

    def _gpu_end(self, f: _InFlight) -> None:
        """The pass is done on the GPU (its peers re-rate now), whether or not the loop has seen it yet."""
        f.ended_s = self.env.now
        self.gpu.end(f.gpu, self.env.now)
        if f.started_s is not None:
            self.clock.on_gpu_time(f.ended_s - f.started_s)

    def _log_step(self, f: _InFlight, start: float) -> None:
        end = f.ended_s if f.ended_s is not None else self.env.now
        rec = step_record(self.model, f.batch, launch=f.ready_s, done=self.env.now, gpu_ms=(end - start) * 1000.0,
                          back_to_back=f.ahead, submitted=f.formed_s)  # fmt: skip
        rec["gpu_start"], rec["gpu_end"] = start, end
        self.step_log.append(rec)

    def _complete(self, f: _InFlight) -> None:
        env, sched = self.env, self.sched
        if f.ended_s is None:
            self._gpu_end(f)
        self.inflight.popleft()
        self.clock.on_complete(env.now, bool(self.inflight))
        start = f.started_s if f.started_s is not None else env.now
        self.batches.add(len(f.batch.rows), (env.now - max(start, self._busy_until)) * 1000.0)
        self._busy_until = env.now
        self.metrics.on_batch(self.model, start, env.now, len(f.batch.rows))
        if self.step_log is not None:
            self._log_step(f, start)
        # Rows whose request left (hop, finish) after the batch was prepared: computed, then thrown away.
        self.wasted_rows += sum(1 for r in f.batch.rows if r.version != r.req.version)
        actions = sched.complete(f.batch, StepResult([0] * len(f.batch.rows)), env.now)
        self.dispatch(self.model, actions)
        self.metrics.on_queue(self.model, env.now, len(sched.waiting))
