"""Batching policies: when a subserver may launch its ready requests (docs/core.md, "Batching policies"): `eager`,
`delayed` (B clamped so the deadlock guard sum_i (B_i - 1) < N holds) and the synchronous baselines, which share a
`SyncGate`. Standard serving is not a policy but the deployment's `baseline`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


def format_b(b: Sequence[int] | None) -> str:
    """B as users read it and the commands parse it: "1,6" ("-" for no B). The one formatter of B."""
    return "-" if b is None else ",".join(str(int(x)) for x in b)


class PolicyKind(StrEnum):
    """Batching policy kinds; str-valued, so YAML and CLI spell them as before."""

    STEP_SYNC = "step-sync"
    MODEL_SYNC = "model-sync"
    EAGER = "eager"
    DELAYED = "delayed"

    @property
    def is_sync(self) -> bool:
        return self in (PolicyKind.STEP_SYNC, PolicyKind.MODEL_SYNC)


def parse_kind(kind: PolicyKind | str) -> PolicyKind:
    try:
        return PolicyKind(kind)
    except ValueError:
        raise ValueError(f"unknown policy {kind!r}; choose one of {', '.join(PolicyKind)}") from None


def guard_holds(thresholds: Sequence[int], concurrency: int) -> bool:
    """The deadlock guard: if all N live requests waited below their thresholds, sum_i k_i <= sum_i (B_i-1)."""
    return sum(b - 1 for b in thresholds) < concurrency


def check_policy(thresholds: Sequence[int], table: Mapping[int, Sequence[int]], max_wait: float | None = None,
                 num_models: int | None = None, concurrency: int | None = None) -> None:  # fmt: skip
    """The one check of a policy every entry runs (a one-line ValueError): one value per model when `num_models` is
    known, every B_i >= 1, the deadlock guard on table rows and at `concurrency`, a finite max_wait >= 0."""
    rows = [("thresholds", concurrency, thresholds), *((f"table row {n}", n, b) for n, b in table.items())]
    for what, n, b in rows:
        if num_models is not None and (b or what != "thresholds") and len(b) != num_models:
            raise ValueError(f"{what} {list(b)} must have one value per model ({num_models})")
        if any(int(x) < 1 for x in b):
            raise ValueError(f"thresholds must be >= 1, got {tuple(b)}")
        if n is not None and b and not guard_holds(b, n):
            raise ValueError(f"thresholds {tuple(b)} infeasible for N={n}: the deadlock guard needs sum(B_i - 1) < N")
    if max_wait is not None and not (math.isfinite(max_wait) and max_wait >= 0):
        raise ValueError(f"max_wait must be a finite number >= 0 or null, got {max_wait}")


def clamp_thresholds(thresholds: Sequence[int], concurrency: int) -> tuple[int, ...]:
    """Lower the largest thresholds (last index first on ties) until the guard holds for `concurrency`.
    Deterministic, so every subserver derives the same B from the same N."""
    b = [max(1, int(x)) for x in thresholds]
    n = max(1, concurrency)
    while not guard_holds(b, n):
        top = max(b)
        i = len(b) - 1 - b[::-1].index(top)
        b[i] -= 1
    return tuple(b)


def scale_thresholds(thresholds: Sequence[int], from_n: int, to_n: int) -> tuple[int, ...]:
    """B tuned for `from_n` requests carried to `to_n` (B grows about in proportion to N): each B_i > 1 scaled by
    to_n / from_n and rounded half up, entries of 1 kept (an eager model stays eager), then clamped for `to_n`."""
    b = [1 if int(x) == 1 else max(1, math.floor(int(x) * to_n / from_n + 0.5)) for x in thresholds]
    return clamp_thresholds(b, to_n)


def table_thresholds(table: Mapping[int, Sequence[int]], concurrency: int) -> tuple[int, ...]:
    """B for live N from a table B(N), before the guard's clamp: a row's N its row; between rows each B_i linear in N
    (rounded half up); above the last row that row scaled to N (`scale_thresholds`); below the first the first."""
    keys = sorted(table)
    if concurrency in table:
        return tuple(int(x) for x in table[concurrency])
    if concurrency < keys[0]:
        return tuple(int(x) for x in table[keys[0]])
    if concurrency > keys[-1]:
        return scale_thresholds(table[keys[-1]], keys[-1], concurrency)
    hi = next(k for k in keys if k > concurrency)
    lo = max(k for k in keys if k < concurrency)
    w = (concurrency - lo) / (hi - lo)
    return tuple(max(1, math.floor(a + w * (b - a) + 0.5)) for a, b in zip(table[lo], table[hi], strict=True))


@dataclass(slots=True)
class Policy:
    """Batching policy of a deployment; thresholds per model index, `table`: N -> thresholds. `max_wait` (s) lets a
    delayed subserver launch under its threshold once its oldest ready request has waited that long."""

    kind: PolicyKind = PolicyKind.EAGER
    thresholds: tuple[int, ...] = ()
    table: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    max_wait: float | None = None
    # thresholds_for by (N, M): asked before every launch, and a policy is replaced, never changed, once made
    _memo: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.kind = parse_kind(self.kind)
        check_policy(self.thresholds, self.table, self.max_wait)

    @property
    def is_sync(self) -> bool:
        return self.kind.is_sync

    def nominal_thresholds(self, concurrency: int, num_models: int) -> tuple[int, ...]:
        """B as configured for `concurrency` (the table's row, else the flat thresholds; all 1 unless delayed),
        before the deadlock guard's clamp."""
        if self.kind is not PolicyKind.DELAYED:
            return (1,) * num_models
        base: Sequence[int] = self.thresholds or (1,) * num_models
        if self.table:
            base = table_thresholds(self.table, concurrency)
        if len(base) != num_models:
            raise ValueError(f"policy has {len(base)} thresholds for {num_models} models")
        return tuple(int(x) for x in base)

    def thresholds_for(self, concurrency: int, num_models: int) -> tuple[int, ...]:
        key = (concurrency, num_models)
        b = self._memo.get(key)
        if b is None:
            b = self._memo[key] = clamp_thresholds(self.nominal_thresholds(concurrency, num_models), concurrency)
        return b


class SyncGate:
    """Global launch gate for the synchronous baselines, shared by every subserver (pure: it decides from what they
    report). A step-sync round forms when nothing runs; a member launches once the messages sent before (`bar`) land."""

    def __init__(self, kind: PolicyKind | str, num_models: int) -> None:
        kind = parse_kind(kind)
        if not kind.is_sync:
            raise ValueError(f"SyncGate is for step-sync and model-sync, not {kind.value!r}")
        self.kind = kind
        self.num_models = num_models
        self.sent = [0] * num_models  # gated messages sent to each model, cumulative
        self.arrived = [0] * num_models  # ... and received by it
        self.running: set[int] = set()
        self.round: set[int] = set()
        self.bar: dict[int, int] = {}  # step-sync: round member -> messages it must have received to launch
        self.turn = 0
        self._ready: list[Callable[[], int]] = [lambda: 0] * num_models

    def attach(self, model: int, ready: Callable[[], int]) -> None:
        self._ready[model] = ready

    def note_sent(self, dst: int) -> None:
        self.sent[dst] += 1

    def note_arrived(self, dst: int) -> None:
        self.arrived[dst] = min(self.sent[dst], self.arrived[dst] + 1)

    @property
    def in_flight(self) -> list[int]:
        return [s - a for s, a in zip(self.sent, self.arrived, strict=True)]

    def _has_work(self, m: int) -> bool:
        return self._ready[m]() > 0 or self.arrived[m] < self.sent[m]

    def may_launch(self, model: int) -> bool:
        if self.kind is PolicyKind.STEP_SYNC:
            # A member whose work went away (an abort, a message for a request that had ended) leaves the round
            # instead of holding the barrier forever.
            self.round = {m for m in self.round if self._ready[m]() > 0 or self.arrived[m] < self.bar[m]}
            if not self.running and not self.round:
                self.round = {m for m in range(self.num_models) if self._has_work(m)}
                self.bar = {m: self.sent[m] for m in self.round}
            return model in self.round and self.arrived[model] >= self.bar[model]
        if self.running:
            return False
        # Model-sync. Nothing runs, so nothing is sent while the chosen model waits: the turn cannot move.
        for k in range(self.num_models):
            m = (self.turn + k) % self.num_models
            if self._has_work(m):
                return m == model and self.arrived[m] == self.sent[m]
        return False

    def on_launch(self, model: int) -> None:
        self.running.add(model)
        self.round.discard(model)

    def on_complete(self, model: int) -> None:
        self.running.discard(model)
        self.turn = (model + 1) % self.num_models
