"""Autotune's estimates for the Markov throughput model, from cumulative counter snapshots differenced and decayed
in the driver's clock (each estimate and why: docs/autotune.md, "What it estimates, from which counters").
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tokenrouter.core.autotune_counters import NUM_BATCH_BUCKETS, CounterSnapshot

MIN_BUCKET_STEPS = 2.0  # a bucket with fewer (decayed) steps is too noisy to anchor the line
# Live N moving by more than N_MOVE (relative) leaves the step times measured before STALE_KEEP of their weight: the
# co-location beside a model changes with N, so steps measured at N = 16 misprice N = 4.
N_MOVE = 0.25
STALE_KEEP = 0.01  # little: a model waits for `min_steps` again


@dataclass(slots=True, frozen=True)
class StepLine:
    """L(b) = intercept_ms + per_row_ms * b, never below `floor_ms` (half the fastest bucket's mean: a line
    extrapolated below the data must not reach 0). `sizes`: the smallest and largest mean batch sizes seen."""

    intercept_ms: float
    per_row_ms: float
    floor_ms: float
    sizes: tuple[float, float]

    def at(self, b: float) -> float:
        return max(self.floor_ms, self.intercept_ms + self.per_row_ms * b)


def fit_step_line(points: Sequence[tuple[float, float, float]]) -> StepLine | None:
    """Weighted least squares of ms on rows over (mean rows, mean ms, weight) points, both coefficients >= 0 (a
    negative slope is noise; a negative intercept puts the line through the origin). None without points."""
    pts = [(r, m, w) for r, m, w in points if w > 0]
    if not pts:
        return None
    wsum = sum(w for _, _, w in pts)
    r_bar = sum(r * w for r, _, w in pts) / wsum
    m_bar = sum(m * w for _, m, w in pts) / wsum
    var = sum(w * (r - r_bar) ** 2 for r, _, w in pts)
    slope = sum(w * (r - r_bar) * (m - m_bar) for r, m, w in pts) / var if var > 1e-12 * wsum else 0.0
    slope = max(0.0, slope)
    intercept = m_bar - slope * r_bar
    if intercept < 0.0:  # the constrained optimum lies on a = 0: least squares through the origin
        intercept, slope = 0.0, sum(w * r * m for r, m, w in pts) / sum(w * r * r for r, _, w in pts)
    floor = 0.5 * min(m for _, m, _ in pts)
    sizes = (min(r for r, _, _ in pts), max(r for r, _, _ in pts))
    return StepLine(intercept, slope, floor, sizes)


@dataclass(slots=True, frozen=True)
class Estimates:
    """What the solve needs, as estimated: live N, hop probability per model (None: the model routed nothing yet),
    step-time line per model (None: it ran no step yet) and the (mean rows, mean ms, weight) points it was fitted
    to, mean output length (None: nothing finished yet) and the outputs' lognormal spread sigma (None: unknown)."""

    concurrency: int
    hop_prob: tuple[float | None, ...]
    step: tuple[StepLine | None, ...]
    mean_output: float | None
    step_points: tuple[tuple[tuple[float, float, float], ...], ...] = ()
    output_sigma: float | None = None
    outputs: tuple[int, ...] = ()  # recent output lengths, newest last (`CounterSnapshot.recent_outputs`)

    def step_table(self, concurrency: int | None = None) -> list[list[float]]:
        """L_i(b) in ms for b = 1..N, one list per model; ValueError if a model has no step estimate."""
        n = concurrency or self.concurrency
        if any(s is None for s in self.step):
            raise ValueError("no step-time estimate for every model yet")
        return [[s.at(b) for b in range(1, n + 1)] for s in self.step]  # type: ignore[union-attr]

    def moved_from(self, old: Estimates, tolerance: float) -> str | None:
        """What moved by more than `tolerance` (relative) since `old`, or None."""
        moved = self.workload_moved_from(old, tolerance)
        if moved is not None:
            return moved
        for i, (s, t) in enumerate(zip(self.step, old.step, strict=True)):
            if (s is None) != (t is None):
                return f"step time of model {i}"
            if s is not None and t is not None:
                b = max(1.0, sum(t.sizes) / 2)
                if abs(s.at(b) - t.at(b)) > tolerance * t.at(b):
                    return f"step time of model {i}"
        a, b = self.mean_output, old.mean_output
        if (a is None) != (b is None) or (a is not None and abs(a - b) > tolerance * b):  # type: ignore[operator]
            return "mean output length"
        return None

    def workload_moved_from(self, old: Estimates, tolerance: float) -> str | None:
        """What of the workload (N, hop probabilities) moved by more than `tolerance` since `old`, or None; not the
        step times (they move with B itself) nor the mean output (noisy, and it moves a closed loop's rate little)."""
        if self.concurrency != old.concurrency:
            return f"N {old.concurrency} -> {self.concurrency}"
        for i, (p, q) in enumerate(zip(self.hop_prob, old.hop_prob, strict=True)):
            if (p is None) != (q is None) or (p is not None and abs(p - q) > tolerance * max(q, 0.01)):  # type: ignore[operator]
                return f"hop probability of model {i}"
        return None

    def describe(self) -> str:
        hop = "/".join("-" if p is None else f"{p:.3f}" for p in self.hop_prob)
        step = " / ".join("-" if s is None else f"{s.intercept_ms:.2f}+{s.per_row_ms:.3f}b" for s in self.step)
        out = "-" if self.mean_output is None else f"{self.mean_output:.0f}"
        return f"N={self.concurrency}, hop {hop}, step ms {step}, mean output {out}"

    def as_dict(self) -> dict[str, object]:
        return {"concurrency": self.concurrency, "hop_prob": list(self.hop_prob),
                "step_intercept_ms": [None if s is None else s.intercept_ms for s in self.step],
                "step_per_row_ms": [None if s is None else s.per_row_ms for s in self.step],
                "mean_output": self.mean_output}  # fmt: skip


class Estimator:
    """Moving estimates from cumulative counter snapshots (module docstring). `drops_token[i]`: model i's
    hand-off drops the token it sampled (its hop is a decision without a committed token)."""

    def __init__(self, drops_token: Sequence[bool], half_life_s: float, step_half_life_s: float) -> None:
        if half_life_s <= 0 or step_half_life_s <= 0:
            raise ValueError("half-lives must be > 0")
        self.drops = tuple(bool(d) for d in drops_token)
        self.half_life_s, self.step_half_life_s = float(half_life_s), float(step_half_life_s)
        m = len(self.drops)
        self.tokens, self.hops = [0.0] * m, [0.0] * m
        self.b_steps = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.b_rows = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.b_ms = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.finished = self.finished_tokens = self.finished_tokens_sq = 0.0
        self.outputs: tuple[int, ...] = ()
        self.live: deque[tuple[float, int]] = deque()
        self._last: CounterSnapshot | None = None
        self._last_t: float | None = None
        self._step_n: float | None = None  # live N the step times were measured at

    @property
    def num_models(self) -> int:
        return len(self.drops)

    def update(self, snap: CounterSnapshot, now: float) -> None:
        """Fold in the counters' change since the previous snapshot; counters that went backwards (a restarted
        subserver) make it the model's new baseline."""
        if len(snap.models) != self.num_models:
            raise ValueError(f"snapshot has {len(snap.models)} models, expected {self.num_models}")
        self.live.append((now, int(snap.live)))
        while len(self.live) > 1 and self.live[0][0] < now - self.half_life_s:
            self.live.popleft()
        self._fade_steps_on_new_n(statistics.median(n for _, n in self.live))
        prev, t0 = self._last, self._last_t
        self._last, self._last_t = snap, now
        if prev is None or t0 is None or now <= t0:
            return
        fast = 0.5 ** ((now - t0) / self.half_life_s)
        slow = 0.5 ** ((now - t0) / self.step_half_life_s)
        for i, (c, p) in enumerate(zip(snap.models, prev.models, strict=True)):
            d_steps = _diff(c.batch_steps, p.batch_steps)
            d_rows = _diff(c.batch_rows, p.batch_rows)
            d_ms = _diff(c.batch_ms, p.batch_ms)
            d_tok, d_hop = c.tokens - p.tokens, c.hops - p.hops
            if d_steps is None or d_rows is None or d_ms is None or d_tok < 0 or d_hop < 0:
                continue  # a restart: this snapshot is the baseline
            self.tokens[i] = self.tokens[i] * fast + d_tok
            self.hops[i] = self.hops[i] * fast + d_hop
            for k in range(NUM_BATCH_BUCKETS):
                self.b_steps[i][k] = self.b_steps[i][k] * slow + d_steps[k]
                self.b_rows[i][k] = self.b_rows[i][k] * slow + d_rows[k]
                self.b_ms[i][k] = self.b_ms[i][k] * slow + d_ms[k]
        d_fin, d_fin_tok = snap.finished - prev.finished, snap.finished_tokens - prev.finished_tokens
        if snap.recent_outputs:
            self.outputs = tuple(snap.recent_outputs)
        d_fin_sq = snap.finished_tokens_sq - prev.finished_tokens_sq
        if d_fin >= 0 and d_fin_tok >= 0 and d_fin_sq >= 0:
            self.finished = self.finished * slow + d_fin
            self.finished_tokens = self.finished_tokens * slow + d_fin_tok
            self.finished_tokens_sq = self.finished_tokens_sq * slow + d_fin_sq

    def _fade_steps_on_new_n(self, n: float) -> None:
        if n < 0.5:
            return  # idle: no N to measure steps at
        if self._step_n is not None and abs(n - self._step_n) > N_MOVE * self._step_n:
            for acc in (self.b_steps, self.b_rows, self.b_ms):
                for row in acc:
                    row[:] = [v * STALE_KEEP for v in row]
        if self._step_n is None or abs(n - self._step_n) > N_MOVE * self._step_n:
            self._step_n = n

    def idle(self) -> bool:
        """No live request in most of the samples of the last half-life (nothing to tune for)."""
        return not self.live or statistics.median(n for _, n in self.live) < 0.5

    def steps(self, model: int) -> float:
        """Decayed step count of `model` (the weight behind its step-time line)."""
        return sum(self.b_steps[model])

    def decisions(self, model: int) -> float:
        return self.tokens[model] + (self.hops[model] if self.drops[model] else 0.0)

    def estimates(self) -> Estimates:
        hop: list[float | None] = []
        lines: list[StepLine | None] = []
        points = []
        for i in range(self.num_models):
            d = self.decisions(i)
            hop.append(min(1.0, self.hops[i] / d) if d > 0 else None)
            pts = [(self.b_rows[i][k] / s, self.b_ms[i][k] / s, s) for k, s in enumerate(self.b_steps[i]) if s > 0]
            # Young counters (no bucket with MIN_BUCKET_STEPS yet): every bucket, however few its steps.
            used = [p for p in pts if p[2] >= MIN_BUCKET_STEPS] or pts
            lines.append(fit_step_line(used))
            points.append(tuple(used))
        live = [n for _, n in self.live]
        n = max(1, round(statistics.median(live))) if live else 1
        mean_out = sigma = None
        if self.finished >= 1.0:
            mean_out = max(1.0, self.finished_tokens / self.finished)
            second = self.finished_tokens_sq / self.finished
            # lognormal: E[X^2] / E[X]^2 = exp(sigma^2)
            sigma = math.sqrt(max(0.0, math.log(max(1.0, second / mean_out**2)))) if second > 0 else None
        return Estimates(n, tuple(hop), tuple(lines), mean_out, tuple(points), sigma, self.outputs)


def _diff(cur: Sequence[float], prev: Sequence[float]) -> list[float] | None:
    """Element-wise cur - prev over NUM_BATCH_BUCKETS (missing entries are 0); None if any went backwards."""
    out = []
    for k in range(NUM_BATCH_BUCKETS):
        d = (cur[k] if k < len(cur) else 0) - (prev[k] if k < len(prev) else 0)
        if d < 0:
            return None
        out.append(d)
    return out
