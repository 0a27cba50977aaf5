"""Autotune's counters: what a subserver counts for the controller (the runtime and the simulator alike) and the
snapshot it reads. Cumulative (one that went backwards marks a restart); step times per batch-size bucket.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

BATCH_BUCKETS: tuple[int, ...] = (*range(1, 17), 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Upper bounds of the batch-size buckets of the step-time counters (bucket k holds sizes in
(BATCH_BUCKETS[k-1], BATCH_BUCKETS[k]]); one more bucket holds every larger batch."""
NUM_BATCH_BUCKETS = len(BATCH_BUCKETS) + 1
RECENT_OUTPUTS = 256
"""Finished requests whose output lengths a snapshot carries: the solve's trials replay them (their shape, not only
their mean, decides which of two near-equal B is faster)."""


def batch_bucket(rows: int) -> int:
    """The bucket of a step of `rows` rows."""
    return bisect_left(BATCH_BUCKETS, max(1, int(rows)))


@dataclass(slots=True)
class BatchTimes:
    """Cumulative step counters per batch-size bucket (`batch_bucket`): steps, rows, and each step's own busy time in
    ms (from its launch, or the previous step's end if later, to its end: summed, the model's busy time)."""

    steps: list[int] = field(default_factory=lambda: [0] * NUM_BATCH_BUCKETS)
    rows: list[int] = field(default_factory=lambda: [0] * NUM_BATCH_BUCKETS)
    ms: list[float] = field(default_factory=lambda: [0.0] * NUM_BATCH_BUCKETS)

    def add(self, rows: int, ms: float) -> None:
        k = batch_bucket(rows)
        self.steps[k] += 1
        self.rows[k] += int(rows)
        self.ms[k] += float(ms)


@dataclass(slots=True, frozen=True)
class ModelCounters:
    """One model's cumulative counters at a snapshot: committed tokens it wrote, hand-offs it sent (not finish
    notices), and its `BatchTimes` lists (empty when the sender has none: an older subserver)."""

    tokens: int = 0
    hops: int = 0
    batch_steps: tuple[int, ...] = ()
    batch_rows: tuple[int, ...] = ()
    batch_ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, tokens: int, hops: int, batches: BatchTimes) -> ModelCounters:
        return cls(tokens, hops, tuple(batches.steps), tuple(batches.rows), tuple(batches.ms))


@dataclass(slots=True, frozen=True)
class CounterSnapshot:
    """What the controller reads at one instant: every model's counters (index = model), the live request count
    N the entry holds, and the requests finished so far with their output tokens (cumulative)."""

    models: tuple[ModelCounters, ...]
    live: int
    finished: int = 0
    finished_tokens: int = 0
    finished_tokens_sq: int = 0  # sum of squared output lengths (their spread)
    recent_outputs: tuple[int, ...] = ()  # the output lengths of the last `RECENT_OUTPUTS` finished, newest last
