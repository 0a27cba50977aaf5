"""Cumulative counters a subserver reports in `protocol.Stats`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    steps: int = 0
    rows: int = 0
    step_ms: float = 0.0  # launch -> result on the host, summed
    tokens: int = 0  # committed tokens this model wrote
    hops: int = 0  # hand-offs sent (requests, not finish notices)

    def step(self, rows: int, seconds: float) -> None:
        self.steps += 1
        self.rows += rows
        self.step_ms += seconds * 1000.0
