"""Passes that share one GPU: each runs at a rate set by what else runs beside it (processor sharing). A pass
carries `work_ms`, its time alone with no SM cap, and progresses at `1 / factor` of it per ms (the SM-cap factor
alone, the largest co-run factor beside others); every start or end re-rates the passes there.
Why not a fixed slowdown at launch: docs/simulator.md#co-location-a-shared-gpu-as-processor-sharing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class GpuPass:
    """One pass executing on a GPU. Times in ms (simulated seconds x 1000 at the edges)."""

    model: int
    tokens: int
    work_ms: float
    on_retime: Callable[[], None]
    done_ms: float = 0.0
    rate: float = 1.0
    last_s: float = 0.0

    def remaining_s(self, now_s: float) -> float:
        """Seconds to the end at the current rate."""
        left = self.work_ms - self.done_ms - (now_s - self.last_s) * 1000.0 * self.rate
        return max(0.0, left / self.rate / 1000.0)

    def advance(self, now_s: float) -> None:
        self.done_ms = min(self.work_ms, self.done_ms + (now_s - self.last_s) * 1000.0 * self.rate)
        self.last_s = now_s


@dataclass(slots=True)
class SharedGpu:
    """The passes running on one GPU. `factor(model, own_tokens, peer, peer_tokens)` is the co-run factor and
    `cap(model, own_tokens)` the alone factor, both relative to the pass's `work_ms`."""

    factor: Callable[[int, int, int, int], float]
    cap: Callable[[int, int], float]
    running: list[GpuPass] = field(default_factory=list)

    def start(self, p: GpuPass, now_s: float) -> None:
        self._advance(now_s)
        p.last_s = now_s
        self.running.append(p)
        self._rerate(now_s, exclude=p)

    def end(self, p: GpuPass, now_s: float) -> None:
        self._advance(now_s)
        self.running.remove(p)
        self._rerate(now_s)

    def _advance(self, now_s: float) -> None:
        for q in self.running:
            q.advance(now_s)

    def _rerate(self, now_s: float, exclude: GpuPass | None = None) -> None:
        for q in self.running:
            others = [o for o in self.running if o.model != q.model]
            if others:
                f = max(self.factor(q.model, q.tokens, o.model, o.tokens) for o in others)
            else:
                f = self.cap(q.model, q.tokens)
            rate = 1.0 / max(f, 1e-9)
            if rate != q.rate:
                q.rate = rate
                if q is not exclude:
                    q.on_retime()
