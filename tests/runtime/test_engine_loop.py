"""`EngineLoop.run` itself, on a fake device whose steps take real time and report their GPU time: under overlap
the loop forms step k+1 late (`wait_to_prepare`), so a request that arrives while step k runs joins k+1; formed
at once, it would wait for k+2. The transport is in-process (no sockets)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Emit
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.runtime.engine_loop import EngineLoop

STEP_S = 0.2  # every fake step's device time


@dataclass
class _Elapsed:
    ms: float

    def elapsed_time(self, end: _Elapsed) -> float:
        return end.ms


class _Handle:
    def __init__(self, batch: Batch, start: float, end: float) -> None:
        self.batch, self.start, self.end = batch, start, end
        self.gpu_start = self.gpu_end = _Elapsed(1000 * (end - start))

    def ready(self) -> bool:
        return time.monotonic() >= self.end

    def result(self) -> StepResult:
        time.sleep(max(0.0, self.end - time.monotonic()))
        return StepResult(next_token_ids=[7] * len(self.batch.rows))


class _Device:
    """Steps run one after another, each STEP_S long, from their launch or the previous step's end."""

    def __init__(self) -> None:
        self.device = SimpleNamespace(type="cuda")  # the loop times steps (the handles carry GPU times)
        self.handles: list[_Handle] = []

    def step(self, batch: Batch, **_: object) -> _Handle:
        start = max(time.monotonic(), self.handles[-1].end if self.handles else 0.0)
        self.handles.append(_Handle(batch, start, start + STEP_S))
        return self.handles[-1]

    def running(self, at: float) -> _Handle | None:
        return next((h for h in self.handles if h.start <= at < h.end), None)


class _Loop(EngineLoop):
    """A second request arrives halfway through the first step >= 3 that the transport sees running."""

    def __init__(self, engine: _Device, sched: Scheduler) -> None:
        super().__init__(engine, sched)
        self.late: Request | None = Request("late", [5, 6, 7, 8], 4, SamplingParams(max_tokens=4, ignore_eos=True))
        self.arrive_at: float | None = None
        self.arrived_during: int | None = None
        self.emitted: list[str] = []

    def receive(self, timeout_s: float) -> None:
        now = time.monotonic()
        if self.arrive_at is None:
            h = self.engine.running(now)
            if h is not None and h.batch.step_id >= 3:
                self.arrive_at, self.arrived_during = h.start + STEP_S / 2, h.batch.step_id
        if self.late is not None and self.arrive_at is not None and now >= self.arrive_at:
            self.deliver(self.sched.add(self.late, now))
            self.late = None
        time.sleep(timeout_s)

    def wait_idle(self) -> None:
        self.stopping = True

    def deliver(self, actions, failed=frozenset()) -> None:
        self.emitted += [a.rid for a in actions if isinstance(a, Emit)]


def test_a_request_arriving_during_step_k_joins_step_k_plus_1():
    sched = Scheduler(0, 2, kv=KVPool(64, 4), router=Router(), overlap=True)
    sched.add(Request("a", [1, 2, 3, 4], 4, SamplingParams(max_tokens=40, ignore_eos=True)))
    dev = _Device()
    loop = _Loop(dev, sched)
    loop.run(max_steps=8)
    assert loop.late is None and loop.arrived_during is not None
    first = next(h.batch.step_id for h in dev.handles if any(r.req.rid == "late" for r in h.batch.rows))
    assert first == loop.arrived_during + 1
    assert loop.clock.duration_s is not None and abs(loop.clock.duration_s - STEP_S) < 1e-9  # GPU times fed it
    assert "late" in loop.emitted and loop.counters.steps == 8
