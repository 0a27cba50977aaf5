"""The runtime's late-prepare rule under overlap: the step-end estimate (`StepClock`) and the loop's wait before it
forms step k+1 (`EngineLoop.wait_to_prepare`), on hand-computed timelines."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tokenrouter.core.overlap import StepClock, prepare_time
from tokenrouter.runtime.engine_loop import EngineLoop, InFlight


def test_no_estimate_until_a_gpu_time_is_known():
    c = StepClock()
    c.on_launch(1.0)
    assert c.end is None
    c.on_gpu_time(0.0)  # CPU: nothing timed, still no estimate
    c.on_complete(1.5, still_running=False)
    c.on_launch(2.0)
    assert c.end is None


def test_ends_chain_behind_the_step_in_flight_and_reanchor_on_completion():
    c = StepClock(alpha=0.5)
    c.on_gpu_time(0.020)
    c.on_launch(1.000)  # nothing in flight: starts now
    assert c.end == pytest.approx(1.020)
    c.on_launch(1.005)  # queued behind the first: starts when it ends
    assert c.end == pytest.approx(1.040)
    c.on_gpu_time(0.030)  # the first took 30 ms: average 25 ms
    c.on_complete(1.031, still_running=True)  # the second started at 1.031
    assert c.end == pytest.approx(1.056)
    c.on_complete(1.060, still_running=False)
    assert c.end is None
    assert prepare_time(1.056, 0.001) == pytest.approx(1.055)


class _Handle:
    def __init__(self, ready_after: int) -> None:
        self.calls, self.ready_after = 0, ready_after

    def ready(self) -> bool:
        self.calls += 1
        return self.calls > self.ready_after


class _Loop(EngineLoop):
    """The loop with a recording transport: each `receive` sleeps its timeout and notes it (ms)."""

    def receive(self, timeout_s: float) -> None:
        self.drains.append(timeout_s * 1000)
        time.sleep(timeout_s)

    def wait_idle(self) -> None:
        raise AssertionError("not idle")

    def deliver(self, actions, failed=frozenset()) -> None:
        pass


def _loop(handle: _Handle, end: float, margin_s: float, overlap: bool = True):
    engine = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    s = _Loop(engine, SimpleNamespace(model=0, prepares_ahead=overlap), prepare_margin_s=margin_s)
    s.inflight.append(InFlight(None, handle, 0.0, True))
    s.clock = StepClock(duration_s=1.0, end=end)
    s.drains = []
    return s


def test_waits_until_the_margin_before_the_estimated_end():
    at_least = time.monotonic() + 0.030
    s = _loop(_Handle(ready_after=10**9), end=at_least + 0.005, margin_s=0.005)
    s.wait_to_prepare()
    assert time.monotonic() >= at_least
    assert s.drains and max(s.drains) <= 2  # short slices, so an early end of the step is seen


def test_stops_waiting_when_the_step_in_flight_is_done():
    s = _loop(_Handle(ready_after=3), end=time.monotonic() + 60.0, margin_s=0.001)
    s.wait_to_prepare()
    assert len(s.drains) == 3


@pytest.mark.parametrize("case", ["no-overlap", "no-estimate", "two-in-flight"])
def test_forms_at_once_without_overlap_estimate_or_with_two_steps_in_flight(case):
    s = _loop(_Handle(ready_after=10**9), end=time.monotonic() + 60.0, margin_s=0.001,
                   overlap=case != "no-overlap")  # fmt: skip
    if case == "no-estimate":
        s.clock.end = None
    if case == "two-in-flight":
        s.inflight.append(s.inflight[0])
    s.wait_to_prepare()
    assert s.drains == []
