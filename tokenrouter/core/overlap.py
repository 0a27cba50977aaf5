"""When an overlapping subserver forms step k+1: the one rule the simulator and the runtime share.

With CPU-GPU overlap, step k+1 is formed and launched while step k runs. Formed right after k's launch, it
misses every peer return that lands during k, and those requests wait a whole extra step (for the 32B model
about 20 ms per hop). Formed `host_s` before k ends, it catches them and the GPU still runs back to back.
The simulator knows k's end exactly; the runtime estimates it (`runtime.step_clock.StepClock`).
"""

from __future__ import annotations


def prepare_time(end_k: float, host_s: float) -> float:
    """The latest time to form step k+1 so that its host work (`host_s`) ends when step k ends."""
    return end_k - host_s
