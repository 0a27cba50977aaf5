"""Cumulative counters a subserver reports in `protocol.Stats`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter.core.autotune_counters import BatchTimes


@dataclass(slots=True)
class Counters:
    """`loop_*` count only steps launched back to back; `loop_ms / loop_gpu_ms - 1` is the runtime's own overhead
    per step (docs/runtime.md, "Loop counters"). `busy_ms` is the length of the union of the steps' [launch, done]
    intervals (overlapped steps count once, unlike `step_ms`). `batches`: steps per batch-size bucket with each
    step's own time, from its submission (or the previous step's end if later) to its end, by the same union sweep.
    Invariant: steps are counted in launch order (one in-flight queue per model), so remembering the latest end
    so far makes both sweeps exact.
    """

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
        """A step launched at `launch` and done at `done` (seconds), handed to the engine at `submitted` (default:
        `launch`); calls come in launch order."""
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
