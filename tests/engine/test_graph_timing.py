"""studies/engine/graph_timing.py on CPU: a fake `torch.cuda` (streams, events on a scripted device clock, a graph
that records what ran inside its capture) checks the order of warm-up, capture and timed replays, and that the
statistics are the scripted replay durations in us per call. The real thing runs only on the GPU studies."""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

import pytest
import torch
from study_script import load_study

MODULE = Path(__file__).resolve().parents[2] / "studies" / "engine" / "graph_timing.py"


@pytest.fixture(scope="module")
def gt():
    return load_study(MODULE)


class FakeCuda:
    """The parts of `torch.cuda` the helper uses. Each replay advances a device clock by the next scripted
    duration (ms); an event records the clock. `log` lists what happened, in order."""

    def __init__(self, durations_ms: list[float]) -> None:
        self.durations = iter(durations_ms)
        self.clock = 0.0
        self.log: list[str] = []
        self.capturing = False
        self.current: object = "default"
        fake = self

        class Stream:
            def wait_stream(self, other) -> None:
                fake.log.append(f"wait {other}")

            def synchronize(self) -> None:
                fake.log.append("sync")

            def __repr__(self) -> str:
                return "side"

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self, stream) -> None:
                assert stream is fake.current, "events go on the timed stream"
                self.t = fake.clock
                fake.log.append("event")

            def elapsed_time(self, end: Event) -> float:
                return end.t - self.t

        class CUDAGraph:
            def replay(self) -> None:
                assert not fake.capturing
                fake.clock += next(fake.durations)
                fake.log.append(f"replay on {fake.current}")

        self.Stream, self.Event, self.CUDAGraph = Stream, Event, CUDAGraph

    def current_stream(self) -> object:
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        prev, self.current = self.current, s
        try:
            yield
        finally:
            self.current = prev

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        assert stream is not None, "captured on the given stream"
        self.capturing, prev, self.current = True, self.current, stream
        self.log.append("capture begin")
        try:
            yield
        finally:
            self.capturing, self.current = False, prev
            self.log.append("capture end")

    def fn(self) -> None:
        self.log.append(f"fn on {self.current}" + (" captured" if self.capturing else ""))


@pytest.fixture
def fake_cuda(monkeypatch):
    def make(durations_ms: list[float]) -> FakeCuda:
        fake = FakeCuda(durations_ms)
        for name in ("Stream", "Event", "CUDAGraph", "current_stream", "stream", "graph"):
            monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
        return fake

    return make


def test_capture_and_time_orders_warmup_capture_and_timed_replays(gt, fake_cuda):
    timed = [4.0, 1.0, 3.0, 2.0, 100.0]  # ms per replay; one outlier
    fake = fake_cuda([9.0] * 3 + timed)  # 3 warm-up replays first, their time unrecorded
    res = gt.capture_and_time(fake.fn, n=5, per=4, warmup_calls=2, warmup_replays=3)
    # Warm-up calls on the side stream after it waited for the current one, a sync, then one captured call.
    assert fake.log[:6] == ["wait default", "fn on side", "fn on side", "sync", "capture begin", "fn on side captured"]
    assert fake.log[6] == "capture end"
    rest = fake.log[7:]
    assert rest[:3] == ["replay on side"] * 3
    assert rest[3:-1] == ["event", "replay on side", "event"] * 5
    assert rest[-1] == "sync"
    assert res.samples_us == (1000.0, 250.0, 750.0, 500.0, 25000.0)  # ms * 1000 / 4 calls per replay
    assert res.median_us == 750.0 and res.min_us == 250.0
    assert res.mean_us == pytest.approx(27500.0 / 5)


def test_back_to_back_times_the_whole_loop(gt, fake_cuda):
    durations = [0.5] * 10 + [0.002 * (k + 1) for k in range(200)]
    fake = fake_cuda(durations)
    res = gt.capture_and_time(fake.fn, n=200, warmup_calls=1, warmup_replays=10, back_to_back=True)
    assert fake.log.count("event") == 2  # nothing between the replays
    mean_ms = sum(durations[10:]) / 200
    assert res.samples_us == (pytest.approx(mean_ms * 1e3),)
    assert res.median_us == res.mean_us == res.samples_us[0]


def test_time_replays_uses_the_given_stream(gt, fake_cuda):
    fake = fake_cuda([2.0] * 8)
    engine_stream = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    res = gt.time_replays(g.replay, engine_stream, n=3, warmup=5)
    assert fake.log.count("replay on side") == 8 and res.samples_us == (2000.0,) * 3


@pytest.mark.parametrize("kw", [{"n": 0}, {"n": 3, "per": 0}, {"n": 3, "warmup_calls": -1}])
def test_bad_arguments_fail_before_capturing(gt, fake_cuda, kw):
    fake = fake_cuda([])
    with pytest.raises(ValueError):
        gt.capture_and_time(fake.fn, **kw)
    assert "capture begin" not in fake.log


def test_statistics_from_event_times(gt):
    res = gt.ReplayTimes.from_elapsed_ms([0.010, 0.030, 0.020, 0.040], per=2)
    assert res.samples_us == pytest.approx((5.0, 15.0, 10.0, 20.0))
    assert res.median_us == pytest.approx(statistics.median([5.0, 15.0, 10.0, 20.0]))
    with pytest.raises(ValueError):
        gt.ReplayTimes.from_elapsed_ms([])
