"""Co-located models in the Markov model: T(B) at the co-location fixed point of that B (docs/markov.md,
"Co-located models"): the chain's busy fractions re-price the steps, iterated (damped by halves) until no busy
fraction moves by more than `tol`. `trsim tune` and autotune share this solve."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenrouter.markov.model import MarkovModel, ThroughputResult
from tokenrouter.markov.search import evaluate_thresholds
from tokenrouter.markov.steps import StepSpec

DELTA_MS = 0.1
"""The quantum (ms) `trsim tune` and autotune solve at; the search coarsens it (within 2% per step) to fit a budget."""

Load = list[tuple[float, float]]
"""Per model: (busy fraction of its busiest co-located peer, that peer's tokens per pass)."""

StepsAt = Callable[[Load | None], Sequence[StepSpec]]
"""Step-time specs of every model at a load (None: every model alone)."""


def peer_load(res: ThroughputResult, tokens_per_row: Sequence[float]) -> Load:
    """The load a solved chain puts on each model: its busiest peer's busy fraction and tokens per pass."""
    busy, load = res.busy_fraction, []
    for i in range(len(busy)):
        j = max((j for j in range(len(busy)) if j != i), key=lambda j: busy[j])
        load.append((busy[j], res.mean_batch[j] * tokens_per_row[j]))
    return load


def tokens_per_row(P: np.ndarray) -> list[float]:
    """Mean tokens a row feeds on each of two models: the first step of a visit feeds what the peer wrote
    in its run (about its run length r_j = 1/(1 - P_jj) tokens), the other r_i - 1 steps feed one each."""
    if len(P) != 2:  # ME: every visit feeds the one token committed since the model's last visit
        return [1.0] * len(P)
    r = [1.0 / max(1e-9, 1.0 - float(P[i][i])) for i in range(2)]
    return [(r[1 - i] + r[i] - 1.0) / r[i] for i in range(2)]


def solve_at_load(steps_at: StepsAt, P: np.ndarray, C: np.ndarray, concurrency: int, delta_ms: float,
                  mean_output: float | None, thresholds: Sequence[int], tpr: Sequence[float], *,
                  load: Load | None = None, iterations: int = 6, tol: float = 0.01,
                  max_states: int | None = None) -> tuple[ThroughputResult, Load]:  # fmt: skip
    """T(B) at the co-location fixed point of B, and that load. `load` is the start (None: the models alone). At most
    `iterations` chain solves; StateSpaceTooLarge when the chain at this B does not fit `max_states` even coarsened."""
    res = None
    kw = {} if max_states is None else {"max_states": max_states}
    for _ in range(iterations):
        model = MarkovModel.create(list(steps_at(load)), P, C, concurrency, delta_ms, mean_output)
        res = evaluate_thresholds(model, thresholds, **kw)[0]
        new = peer_load(res, tpr)
        if load is not None:
            moved = max(abs(a[0] - b[0]) for a, b in zip(load, new, strict=True))
            new = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2) for a, b in zip(load, new, strict=True)]
            if moved < tol:
                return res, new
        load = new
    assert res is not None and load is not None
    return res, load
