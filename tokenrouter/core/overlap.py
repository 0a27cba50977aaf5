"""When an overlapping subserver forms step k+1: the one rule the simulator and the runtime share.

Formed right after step k's launch, step k+1 would miss every peer return that lands during k (a whole extra step
per hop); formed `host_s` before k ends, it catches them and the GPU still runs back to back. The simulator knows
k's end exactly; the runtime estimates it (`runtime.step_clock.StepClock`).
"""

from __future__ import annotations


def prepare_time(end_k: float, host_s: float) -> float:
    """The latest time to form step k+1 so that its host work (`host_s`) ends when step k ends."""
    return end_k - host_s
