"""Capture a callable in a CUDA graph and time its replays with CUDA events: the one way the engine studies
(gemv_probe, perf_probe, engine_bench, attention_bench) capture and time graphs, so their numbers are
measured alike.

    times = capture_and_time(body, n=25, per=copies)   # warm up, capture, replay, time
    times.median_us                                     # us per call of the captured work

GPU only (CPU smoke runs of the studies time their eager calls instead). `torch.cuda` is looked up at call
time, so the tests can stand a fake in for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

__all__ = ["ReplayTimes", "capture_and_time", "capture_graph", "time_replays"]


@dataclass(frozen=True, slots=True)
class ReplayTimes:
    """Timed replays of one graph in microseconds per call (a replay's time divided by the calls of the captured
    work it makes). `samples_us` has one value per timed replay, or, for a back-to-back loop, one value: the
    loop's time over its replays."""

    samples_us: tuple[float, ...]

    @classmethod
    def from_elapsed_ms(cls, elapsed_ms: Iterable[float], per: int = 1) -> ReplayTimes:
        """From CUDA-event times in milliseconds (what `Event.elapsed_time` returns) of replays making `per`
        calls each."""
        _check_positive(per=per)
        samples = tuple(ms * 1e3 / per for ms in elapsed_ms)
        if not samples:
            raise ValueError("no replay was timed")
        return cls(samples)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.samples_us)


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def capture_graph(
    fn: Callable[[], object], *, stream: torch.cuda.Stream | None = None, warmup: int = 2
) -> tuple[torch.cuda.CUDAGraph, torch.cuda.Stream]:
    """`fn` run `warmup` times on `stream` (a new side stream when None), then one call of it captured into a new
    graph on that stream; returns (graph, stream). `fn` must write into static buffers: a replay redoes its
    captured kernels on the same memory.

    The stream first waits for the current stream, where `fn`'s inputs were made; the warm-up calls compile
    kernels and fill the allocator outside the capture, and the stream is synchronized before capturing."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    cuda = torch.cuda
    s = stream if stream is not None else cuda.Stream()
    s.wait_stream(cuda.current_stream())
    with cuda.stream(s):
        for _ in range(warmup):
            fn()
    s.synchronize()
    g = cuda.CUDAGraph()
    with cuda.graph(g, stream=s):
        fn()
    return g, s


def time_replays(
    replay: Callable[[], object],
    stream: torch.cuda.Stream,
    *,
    n: int,
    warmup: int = 5,
    per: int = 1,
    back_to_back: bool = False,
) -> ReplayTimes:
    """`replay` (a graph's `replay`, or anything that launches work on `stream`) run `warmup` times, then `n` timed
    times on `stream`, `per` calls of the measured work each.

    Default: a pair of events around each replay, one sample each (device time of one replay). back_to_back:
    one pair of events around all n replays, one sample of the loop's time over n (with nothing between the
    replays, a tiny graph measures how fast the host can launch graphs)."""
    _check_positive(n=n, per=per)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    cuda = torch.cuda
    with cuda.stream(stream):
        for _ in range(warmup):
            replay()
        if back_to_back:
            a, b = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            a.record(stream)
            for _ in range(n):
                replay()
            b.record(stream)
            pairs = [(a, b)]
        else:
            pairs = []
            for _ in range(n):
                a, b = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
                a.record(stream)
                replay()
                b.record(stream)
                pairs.append((a, b))
        stream.synchronize()
    elapsed = [a.elapsed_time(b) for a, b in pairs]
    if back_to_back:
        elapsed = [elapsed[0] / n]
    return ReplayTimes.from_elapsed_ms(elapsed, per)


def capture_and_time(
    fn: Callable[[], object],
    *,
    n: int,
    per: int = 1,
    warmup_calls: int = 2,
    warmup_replays: int = 5,
    stream: torch.cuda.Stream | None = None,
    back_to_back: bool = False,
) -> ReplayTimes:
    """`capture_graph(fn)` then `time_replays` of the graph (dropped on return, its memory back to the pool)."""
    _check_positive(n=n, per=per)  # before capturing: a bad argument costs no capture
    g, s = capture_graph(fn, stream=stream, warmup=warmup_calls)
    return time_replays(g.replay, s, n=n, warmup=warmup_replays, per=per, back_to_back=back_to_back)
