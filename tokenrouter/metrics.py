"""Serving metrics, defined as SGLang's ``bench_serving`` defines them (docs/simulator.md#metrics), for simulator
and runtime runs. The driver's hooks only append; ``summary()`` and ``to_frame()`` do the arithmetic at the end
(latencies in ms), over completed requests. ITL spreads each chunk's gap over its k tokens, so it sums to E2E - TTFT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MetricsCollector", "RequestRecord"]

_STATS = (("mean", None), ("p50", 50.0), ("p99", 99.0))


@dataclass(slots=True)
class RequestRecord:
    """What one request did. Times in seconds; chunks are (time, n_tokens) commits in call order."""

    rid: str
    arrival: float
    prompt_len: int
    chunk_times: list[float] = field(default_factory=list)
    chunk_counts: list[int] = field(default_factory=list)
    model_tokens: dict[int, int] = field(default_factory=dict)
    output_len: int = 0
    num_hops: int = 0
    last_model: int = -1
    finish: float | None = None

    @property
    def token_times(self) -> list[float]:
        """One time per output token; tokens committed together share a time."""
        return [t for t, n in zip(self.chunk_times, self.chunk_counts, strict=True) for _ in range(n)]

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.arrival if self.chunk_times else float("nan")

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1] - self.arrival if self.chunk_times else float("nan")


@dataclass(slots=True)
class _ModelTrace:
    step_start: list[float] = field(default_factory=list)
    step_end: list[float] = field(default_factory=list)
    step_size: list[int] = field(default_factory=list)
    queue_t: list[float] = field(default_factory=list)
    queue_n: list[int] = field(default_factory=list)


class MetricsCollector:
    """Collects per-request token commits and per-model steps/queues during a run; summarizes at the end.
    ``num_models`` models get per-model keys even if one never ran; more are picked up as they appear."""

    def __init__(self, num_models: int = 0) -> None:
        self.records: dict[str, RequestRecord] = {}
        self._models: dict[int, _ModelTrace] = {i: _ModelTrace() for i in range(num_models)}

    # ---- hot path: append only -------------------------------------------------------------------------
    def on_arrival(self, rid: str, t: float, prompt_len: int) -> None:
        if rid in self.records:
            raise ValueError(f"request {rid!r} arrived twice")
        self.records[rid] = RequestRecord(rid, t, prompt_len)

    def on_tokens(self, rid: str, n: int, t: float, model: int) -> None:
        """``n`` output tokens of ``rid``, written by ``model``, committed at time ``t`` (s)."""
        if n <= 0:
            return
        rec = self.records[rid]
        rec.chunk_times.append(t)
        rec.chunk_counts.append(n)
        rec.output_len += n
        rec.model_tokens[model] = rec.model_tokens.get(model, 0) + n
        if model != rec.last_model:
            if rec.last_model >= 0:
                rec.num_hops += 1
            rec.last_model = model

    def on_finish(self, rid: str, t: float, num_hops: int | None = None) -> None:
        rec = self.records[rid]
        rec.finish = t
        if num_hops is not None:
            rec.num_hops = num_hops

    def on_batch(self, model: int, t_start: float, t_end: float, size: int) -> None:
        """Model ``model`` ran a step of ``size`` rows from ``t_start`` to ``t_end`` (s)."""
        m = self._models.get(model) or self._models.setdefault(model, _ModelTrace())
        m.step_start.append(t_start)
        m.step_end.append(t_end)
        m.step_size.append(size)

    def on_queue(self, model: int, t: float, waiting: int) -> None:
        """From time ``t`` on, ``waiting`` requests are ready but not running on ``model``."""
        m = self._models.get(model) or self._models.setdefault(model, _ModelTrace())
        m.queue_t.append(t)
        m.queue_n.append(waiting)

    # ---- accessors for plots and studies -----------------------------------------------------------------
    @property
    def models(self) -> list[int]:
        seen = set(self._models)
        for rec in self.records.values():
            seen.update(rec.model_tokens)
        return sorted(seen)

    def batch_series(self, model: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t_start s, t_end s, size) arrays of ``model``'s steps."""
        m = self._models.get(model, _ModelTrace())
        return np.asarray(m.step_start, float), np.asarray(m.step_end, float), np.asarray(m.step_size, np.int64)

    def queue_series(self, model: int) -> tuple[np.ndarray, np.ndarray]:
        """(t s, waiting) arrays for ``model``: a step function, each value holding until the next time."""
        m = self._models.get(model, _ModelTrace())
        return np.asarray(m.queue_t, float), np.asarray(m.queue_n, np.int64)

    # ---- end of run --------------------------------------------------------------------------------------
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.records.values() if r.finish is not None]

    def duration(self) -> float:
        """First arrival to last finish of the completed requests (s); NaN if none completed."""
        done = self.completed()
        if not done:
            return float("nan")
        return max(r.finish for r in done) - min(r.arrival for r in done)  # type: ignore[type-var]

    def itl(self) -> np.ndarray:
        """Pooled inter-token latencies (s) of completed requests, bench_serving's chunk rule."""
        return _itl(self.completed())

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, float]:
        """Flat metric dict: counts, throughputs (tok/s, req/s), latencies (ms), per-model figures."""
        done = self.completed()
        dur = self.duration()
        out_tokens = sum(r.output_len for r in done)
        s: dict[str, float] = {
            "requests_completed": float(len(done)), "requests_unfinished": float(len(self.records) - len(done)),
            "duration_s": dur, "total_input_tokens": float(sum(r.prompt_len for r in done)),
            "total_output_tokens": float(out_tokens), "request_throughput_req_s": _ratio(len(done), dur),
            "output_throughput_tok_s": _ratio(out_tokens, dur),
        }  # fmt: skip
        ttft = np.array([r.ttft for r in done], float)
        e2e = np.array([r.e2e for r in done], float)
        n_out = np.array([r.output_len for r in done], float)
        multi = n_out > 1
        tpot = (e2e[multi] - ttft[multi]) / (n_out[multi] - 1)
        for name, x in (("ttft", ttft), ("tpot", tpot), ("itl", _itl(done)), ("e2e", e2e)):
            s.update(_stats(f"{name}_ms", x * 1e3))
        s["hops_mean"] = float(np.mean([r.num_hops for r in done])) if done else float("nan")

        for i in self.models:
            s.update(self._model_summary(i, done, dur, out_tokens))
        if window is not None:
            s.update(self._window_summary(window))
        return s

    def _model_summary(self, i: int, done: list[RequestRecord], dur: float, out_tokens: int) -> dict[str, float]:
        tokens = sum(r.model_tokens.get(i, 0) for r in done)
        start, end, size = self.batch_series(i)
        t0 = min((r.arrival for r in done), default=float("nan"))
        q_t, q_n = self.queue_series(i)
        ran, nan = len(size) > 0, float("nan")
        busy = busy_time(start, end, t0, t0 + dur)
        return {
            f"tokens_model{i}": float(tokens), f"token_frac_model{i}": _ratio(tokens, out_tokens),
            f"steps_model{i}": float(len(size)), f"busy_frac_model{i}": _ratio(busy, dur),
            f"batch_mean_model{i}": float(size.mean()) if ran else nan,
            f"batch_p50_model{i}": float(np.percentile(size, 50)) if ran else nan,
            f"batch_p99_model{i}": float(np.percentile(size, 99)) if ran else nan,
            f"batch_max_model{i}": float(size.max()) if ran else nan,
            f"queue_mean_model{i}": time_weighted_mean(q_t, q_n, t0, t0 + dur),
        }  # fmt: skip

    def _window_summary(self, window: tuple[float, float]) -> dict[str, float]:
        t0, t1 = window
        if not t1 > t0:
            raise ValueError(f"window must have t1 > t0, got {window}")
        width = t1 - t0
        tokens = 0
        for r in self.records.values():
            times = np.asarray(r.chunk_times)
            inside = (times > t0) & (times <= t1)
            tokens += int(np.asarray(r.chunk_counts)[inside].sum()) if inside.any() else 0
        finished = sum(1 for r in self.records.values() if r.finish is not None and t0 < r.finish <= t1)
        s = {
            "steady_output_throughput_tok_s": tokens / width,
            "steady_request_throughput_req_s": finished / width,
        }
        for i in self.models:
            start, end, _ = self.batch_series(i)
            s[f"steady_busy_frac_model{i}"] = busy_time(start, end, t0, t1) / width
        return s

    def to_frame(self) -> pd.DataFrame:
        """One row per request (finished or not); times in seconds."""
        import pandas as pd  # only at the end of a run: keeps importing this module light

        models = self.models
        rows = []
        for r in self.records.values():
            row = {
                "rid": r.rid, "arrival_s": r.arrival, "finish_s": r.finish if r.finish is not None else float("nan"),
                "completed": r.finish is not None, "prompt_len": r.prompt_len, "output_len": r.output_len,
                "ttft_s": r.ttft, "e2e_s": r.e2e,
                "tpot_s": (r.e2e - r.ttft) / (r.output_len - 1) if r.output_len > 1 else float("nan"),
                "num_hops": r.num_hops,
            }  # fmt: skip
            for i in models:
                row[f"tokens_model{i}"] = r.model_tokens.get(i, 0)
            rows.append(row)
        return pd.DataFrame(rows)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _stats(prefix: str, x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    if not len(x):
        return {f"{prefix}_{k}": float("nan") for k, _ in _STATS}
    return {f"{prefix}_{k}": float(x.mean() if q is None else np.percentile(x, q)) for k, q in _STATS}


def _itl(records: list[RequestRecord]) -> np.ndarray:
    """bench_serving ITL, vectorized over all records: merge same-instant chunks, spread gaps over tokens."""
    recs = [r for r in records if r.chunk_times]
    if not recs:
        return np.empty(0)
    times = np.concatenate([np.asarray(r.chunk_times, float) for r in recs])
    counts = np.concatenate([np.asarray(r.chunk_counts, np.int64) for r in recs])
    owner = np.repeat(np.arange(len(recs)), [len(r.chunk_times) for r in recs])
    # A chunk starts where the request changes or the time moves on; equal-time commits are one chunk.
    new = np.ones(len(times), bool)
    new[1:] = (owner[1:] != owner[:-1]) | (times[1:] != times[:-1])
    starts = np.flatnonzero(new)
    times, owner, counts = times[starts], owner[starts], np.add.reduceat(counts, starts)
    follow = np.flatnonzero(owner[1:] == owner[:-1]) + 1  # chunks that have a previous chunk in their request
    gaps = (times[follow] - times[follow - 1]) / counts[follow]
    return np.repeat(gaps, counts[follow])


def busy_time(start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> float:
    """Length of the union of [start, end) intervals inside [t0, t1) (s); overlapping steps count once."""
    if not len(start) or not t1 > t0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s = np.clip(start[order], t0, t1)
    e = np.clip(end[order], t0, t1)
    # Sorted by start, the part of step k not already covered begins at max(s_k, latest end before k).
    prev_end = np.maximum.accumulate(np.concatenate(([t0], e[:-1])))
    return float(np.clip(e - np.maximum(s, prev_end), 0.0, None).sum())


def time_weighted_mean(t: np.ndarray, v: np.ndarray, t0: float, t1: float) -> float:
    """Mean over [t0, t1) of the step function that takes value v[k] from t[k] on (0 before t[0])."""
    if not len(t) or not t1 > t0:
        return float("nan")
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    edges = np.clip(np.concatenate((t, [t1])), t0, t1)
    return float((v * np.diff(edges)).sum() / (t1 - t0))
