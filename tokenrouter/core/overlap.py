"""When an overlapping subserver forms step k+1 (docs/core.md, Overlap): `host_s` before step k ends, so returns
landing during k still join it and the GPU runs back to back. The runtime estimates k's end (`StepClock`).
"""

from __future__ import annotations


def prepare_time(end_k: float, host_s: float) -> float:
    """The latest time to form step k+1 so that its host work (`host_s`) ends when step k ends."""
    return end_k - host_s
