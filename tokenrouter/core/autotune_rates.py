"""Autotune's measurements of serving itself over a stretch of time (committed-token rate, hop probabilities, live
N), against which a change of B is verified (`core.autotune`, `Trial`). A `Window` holds the stretch's own values,
not the decayed estimates, which lag a shift by a half-life (`Window.same_workload`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tokenrouter.core.autotune_counters import CounterSnapshot


@dataclass(slots=True, frozen=True)
class Window:
    """What one stretch of serving measured on its own: the committed-token rate, each model's hop probability (None
    where it decided nothing), the median live count, and whether it held (`steady`: within one request or 10%)."""

    tok_s: float
    hop_prob: tuple[float | None, ...]
    live: float
    steady: bool = True

    def same_workload(self, other: Window, tolerance: float) -> bool:
        """The two windows served one workload: the same median N, hop probabilities within `tolerance` (relative to
        the larger of the probability and 0.1); own values, as decayed estimates either side of a shift look alike."""
        if self.live != other.live or not (self.steady and other.steady):
            return False
        for p, q in zip(self.hop_prob, other.hop_prob, strict=True):
            if (p is None) != (q is None) or (p is not None and abs(p - q) > tolerance * max(q, 0.1)):  # type: ignore[operator]
                return False
        return True


class RateLog:
    """Recent snapshots as (time, committed tokens, per-model hand-offs, per-model decisions, live count), for what a
    window of serving measured (`window`). Tokens that went backwards (a restarted subserver) start it again."""

    def __init__(self, keep_s: float, drops_token: Sequence[bool]) -> None:
        self.keep_s = keep_s
        self.drops = tuple(drops_token)
        self.points: deque[tuple[float, int, tuple[int, ...], tuple[int, ...], int]] = deque()

    def add(self, now: float, snap: CounterSnapshot) -> None:
        tokens = sum(m.tokens for m in snap.models)
        if self.points and tokens < self.points[-1][1]:
            self.points.clear()
        hops = tuple(m.hops for m in snap.models)
        decisions = tuple(m.tokens + (m.hops if d else 0) for m, d in zip(snap.models, self.drops, strict=True))
        self.points.append((now, tokens, hops, decisions, int(snap.live)))
        while len(self.points) > 2 and self.points[1][0] < now - self.keep_s:
            self.points.popleft()

    def _index_at_or_before(self, t: float) -> int | None:
        best = None
        for k, p in enumerate(self.points):
            if p[0] > t:
                break
            best = k
        return best

    def window(self, a: float, b: float) -> Window | None:
        """[a, b] as measured between the last snapshots at or before each end; None when the log does not reach
        back to `a` or the span is under half of [a, b]."""
        i, j = self._index_at_or_before(a), self._index_at_or_before(b)
        if i is None or j is None:
            return None
        p0, p1 = self.points[i], self.points[j]
        if p1[0] <= p0[0] or p1[0] - p0[0] < 0.5 * (b - a):
            return None
        hop = tuple((h1 - h0) / (d1 - d0) if d1 > d0 else None
                    for h0, h1, d0, d1 in zip(p0[2], p1[2], p0[3], p1[3], strict=True))  # fmt: skip
        # The start sample counts: with sparse samples (the controller does not observe while a solve runs) the
        # window's rate spans from it, and an N that changed before the next sample would not show otherwise.
        live = [p[4] for k, p in enumerate(self.points) if i <= k <= j]
        mid = float(statistics.median(live))
        steady = all(abs(n - mid) <= max(1.0, 0.1 * mid) for n in live)
        return Window((p1[1] - p0[1]) / (p1[0] - p0[0]), hop, mid, steady)
