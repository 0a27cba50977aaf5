"""Cumulative counters a subserver reports in `protocol.Stats`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter.core.autotune_counters import BatchTimes


@dataclass(slots=True)
class Counters:
    """`loop_*`: steps launched back to back (docs/runtime.md); `busy_ms`: the union of the steps' [launch, done];
    `batches`: per batch size, same sweep from submission. Steps come in launch order, so both sweeps are exact."""

    steps: int = 0
    rows: int = 0
    step_ms: float = 0.0  # launch -> result on the host, summed
    tokens: int = 0  # committed tokens this model wrote
    hops: int = 0  # hand-offs sent (requests, not finish notices)
    loop_steps: int = 0
    loop_rows: int = 0
    loop_ms: float = 0.0
    loop_gpu_ms: float = 0.0
    busy_ms: float = 0.0
    busy_until: float = float("-inf")  # the latest step end counted in busy_ms (seconds, the caller's clock)
    batches: BatchTimes = field(default_factory=BatchTimes)
    batch_until: float = float("-inf")  # the latest step end counted in `batches`

    def step(self, rows: int, launch: float, done: float, submitted: float | None = None) -> None:
        """A step handed over at `submitted` (default `launch`), launched at `launch`, done at `done` (seconds)."""
        self.steps += 1
        self.rows += rows
        self.step_ms += (done - launch) * 1000.0
        self.busy_ms += max(0.0, done - max(launch, self.busy_until)) * 1000.0
        self.busy_until = max(self.busy_until, done)
        start = launch if submitted is None else min(submitted, launch)
        self.batches.add(rows, max(0.0, done - max(start, self.batch_until)) * 1000.0)
        self.batch_until = max(self.batch_until, done)

    def loop_step(self, rows: int, period_s: float, gpu_ms: float) -> None:
        self.loop_steps += 1
        self.loop_rows += rows
        self.loop_ms += period_s * 1000.0
        self.loop_gpu_ms += gpu_ms
