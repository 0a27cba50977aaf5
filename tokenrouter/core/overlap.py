"""When an overlapping subserver forms step k+1 (docs/core.md, Overlap): `host_s` before step k ends, so returns
landing during k still join it and the GPU runs back to back. k's end is an estimate (`StepClock`): end(k) =
max(launch(k), end(k-1)) + duration, the duration a moving average of measured GPU times (no estimate before one,
nor on CPU). Until then the loop takes messages in `PREPARE_POLL_S` slices, so an early end of k is seen that late
at most. The runtime and the simulator both follow these (the simulator's overlap idles as the runtime's does).
"""

from __future__ import annotations

from dataclasses import dataclass

PREPARE_POLL_S = 0.002
"""While waiting to form k+1, messages are taken in waits of at most this long, then k's handle is looked at."""


def prepare_time(end_k: float, host_s: float) -> float:
    """The latest time to form step k+1 so that its host work (`host_s`) ends when step k ends."""
    return end_k - host_s


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
