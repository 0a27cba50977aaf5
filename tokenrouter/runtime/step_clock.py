"""When the step in flight ends, for `core.overlap.prepare_time`: end(k) = max(launch(k), end(k-1)) + duration,
with the duration a moving average of measured GPU times (no estimate before one, nor on CPU)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepClock:
    """Invariant: `end` is the estimated end of the newest launched step, or None without an estimate."""

    alpha: float = 0.3  # weight of the newest GPU time in the moving average
    duration_s: float | None = None
    end: float | None = None

    def on_launch(self, now: float) -> None:
        if self.duration_s is None:
            self.end = None
            return
        start = now if self.end is None else max(now, self.end)
        self.end = start + self.duration_s

    def on_complete(self, now: float, still_running: bool) -> None:
        """The oldest step ended at `now`: the next one in flight (if any) started then."""
        if not still_running or self.duration_s is None:
            self.end = None
        else:
            self.end = now + self.duration_s

    def on_gpu_time(self, seconds: float) -> None:
        if seconds <= 0.0:
            return
        d = self.duration_s
        self.duration_s = seconds if d is None else d + self.alpha * (seconds - d)
