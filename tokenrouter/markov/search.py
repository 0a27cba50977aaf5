"""Threshold search within a state budget, with fallbacks instead of a crash (docs/markov.md, "A budgeted search"):
exact within the budget (`state_bounds`), else coarser quanta (no step rounded by more than `MAX_ROUNDING`), then
a grid of thresholds, then the search at N/2 with B* scaled by 2. The outcome's `note` says which one happened.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenrouter.core import policy
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.markov.model import MarkovModel, ThroughputResult
from tokenrouter.markov.steps import feasible_thresholds

SEARCH_STATES = 100_000
"""Default budget of one search: states explored and solved together (a few seconds on one core)."""
MAX_CANDIDATES = 20_000  # beyond this many feasible B the full set is not even listed
MAX_ROUNDING = 0.02  # a coarser quantum may round a step time by at most this fraction of it


@dataclass(slots=True)
class SearchOutcome:
    """What a budgeted search found (`thresholds` feasible for the model's N): `ranked` best first, under `model`
    (maybe a coarser quantum); `exact`: every feasible B at the quantum asked for; `note`: what was reduced."""

    thresholds: tuple[int, ...]
    throughput_tok_s: float | None
    ranked: list[ThroughputResult]
    model: MarkovModel
    exact: bool
    note: str


def state_bound(model: MarkovModel, thresholds: Sequence[int]) -> float:
    """An upper bound on the chain's states (k, b, r): the coefficient of x^N of prod_i (idle_i + run_i)(x) minus the
    same product with no model completing, idle_i(x) = sum_{k < B_i} x^k, run_i(x) = sum_{b >= B_i, k >= 0}
    (residuals d_i(b)) x^(b + k). In floating point: exact below 2^53, an estimate beyond."""
    return float(state_bounds(model, [model.check_thresholds(thresholds)])[0])


def state_bounds(model: MarkovModel, candidates: Sequence[Sequence[int]]) -> np.ndarray:
    """`state_bound` of each candidate; the per-model polynomials depend on B_i only and are shared."""
    n = model.concurrency
    polys: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def poly(i: int, b_min: int) -> tuple[np.ndarray, np.ndarray]:
        if (i, b_min) not in polys:
            d = model.step.quanta[i].astype(float)
            weight = np.zeros(n + 1)
            weight[b_min:] = d[b_min:]  # b running (weight = its residual values) ...
            run = np.cumsum(weight)  # ... and any k >= 0 waiting: degree b + k
            count = np.zeros(n + 1)
            count[b_min:] = 1.0
            idle = (np.arange(n + 1) < b_min).astype(float)
            polys[i, b_min] = (idle + run, idle + run - np.cumsum(count))
        return polys[i, b_min]

    out = np.empty(len(candidates))
    for c, b in enumerate(candidates):
        with_zero, without = np.ones(1), np.ones(1)
        for i, b_min in enumerate(b):
            a, z = poly(i, b_min)
            with_zero, without = np.convolve(with_zero, a)[: n + 1], np.convolve(without, z)[: n + 1]
        out[c] = with_zero[n] - without[n] if len(with_zero) > n else 0.0
    return out


def quantum_ladder(model: MarkovModel) -> list[MarkovModel]:
    """`model` on coarser grids that round no step by more than MAX_ROUNDING of it (or than `model` does),
    each with at most 2/3 of the previous one's quanta for the longest step; coarsest first, `model` last."""
    table = model.step.table_ms
    tolerance = max(MAX_ROUNDING, _relative_rounding(model))
    longest = float(table.max())
    levels = [model]
    for target in range(model.step.max_quanta - 1, 0, -1):
        if target > levels[-1].step.max_quanta * 2 // 3:
            continue
        coarser = model.with_quantum(longest / target)
        if _relative_rounding(coarser) <= tolerance and coarser.step.max_quanta < levels[-1].step.max_quanta:
            levels.append(coarser)
    return levels[::-1]


def _relative_rounding(model: MarkovModel) -> float:
    q = model.step
    rounded = q.quanta[:, 1:] * q.delta_eff_ms
    return float((np.abs(rounded - q.table_ms) / q.table_ms).max())


def threshold_grid(num_models: int, concurrency: int) -> list[tuple[int, ...]]:
    """Feasible B whose entries are powers of two or N (lexicographic order)."""
    values = sorted({1 << e for e in range(concurrency.bit_length())} | {concurrency})
    grid = itertools.product(values, repeat=num_models)
    return [b for b in grid if policy.guard_holds(b, concurrency)]


def search_thresholds(model: MarkovModel, max_states: int = SEARCH_STATES) -> SearchOutcome:
    """B* within `max_states`, falling back as the module docstring says; never raises for size."""
    m, n = model.num_models, model.concurrency
    n_full = math.comb(n - 1 + m, m)  # B_i - 1 >= 0 summing to at most N - 1
    grid = threshold_grid(m, n)
    tries: list[tuple[list[tuple[int, ...]], str]] = []
    if n_full <= MAX_CANDIDATES:
        full = feasible_thresholds(m, n)
        bound = float(state_bounds(model, full).sum())
        if bound <= max_states:
            return _outcome(model, model.search(full, max_states), exact=True, note="")
        why = f"Markov search for N={n}: up to {bound:,.0f} states, over the budget of {max_states:,}"
        tries.append((full, "all"))
    else:
        why = f"Markov search for N={n}: {n_full:,} feasible thresholds, too many to list"
    if len(grid) < n_full:
        tries.append((grid, "a power-of-two grid of"))
    for cands, what in tries:
        level = _finest_fitting(model, cands, max_states)
        if level is None:
            continue
        exact = level is model and what == "all"
        note = "" if exact else f"{why}; searched {what} {len(cands)} of {n_full:,} thresholds{_grid_note(level)}"
        return _outcome(level, level.search(cands, max_states), exact=exact, note=note)
    return _scaled_from_smaller(model, max_states, f"{why}, even on a grid of {len(grid)} thresholds")


def _scaled_from_smaller(model: MarkovModel, max_states: int, why: str) -> SearchOutcome:
    n = model.concurrency
    smaller = search_thresholds(model.with_concurrency(max(1, n // 2)), max_states)
    b = scale_thresholds(smaller.thresholds, smaller.model.concurrency, n)
    try:  # one B's chain is far smaller than a search's (0.01-0.05 s at 5,000 states, N = 8-64): the whole budget
        res, level, _ = evaluate_thresholds(model, b, max_states)
        predicted, ranked = res.throughput_tok_s, [res]
    except StateSpaceTooLarge:
        predicted, ranked, level = None, [], model
    src = policy.format_b(smaller.thresholds)
    note = f"{why}; B scaled from the search at N={smaller.model.concurrency} (B*={src})"
    return SearchOutcome(b, predicted, ranked, level, exact=False, note=note)


def scale_thresholds(thresholds: Sequence[int], from_n: int, to_n: int) -> tuple[int, ...]:
    """B scaled from `from_n` to `to_n`: the core's rule (`core.policy.scale_thresholds`, which a tuned table
    follows above its last row)."""
    return policy.scale_thresholds(thresholds, from_n, to_n)


def evaluate_thresholds(
    model: MarkovModel, thresholds: Sequence[int], max_states: int = SEARCH_STATES
) -> tuple[ThroughputResult, MarkovModel, str]:
    """T(B) for one B within `max_states`: (result, the model used, note). The quantum is coarsened (within
    MAX_ROUNDING) when the chain does not fit; StateSpaceTooLarge if it does not fit even so."""
    b = model.check_thresholds(thresholds)
    level = model if state_bound(model, b) <= max_states else _finest_fitting(model, [b], max_states)
    if level is None:
        raise StateSpaceTooLarge(max_states, model.num_models, model.concurrency)
    note = ""
    if level is not model:
        n = model.concurrency
        note = f"the chain at N={n} exceeds {max_states:,} states on the quantum asked for; solved{_grid_note(level)}"
    return level.throughput(b, max_states), level, note


def _finest_fitting(model: MarkovModel, cands: Sequence[Sequence[int]], max_states: int) -> MarkovModel | None:
    """The finest level of `quantum_ladder` whose chains for `cands` explore within `max_states`, probing the
    coarsest first and stopping at the first that does not fit (so at most one capped exploration is lost)."""
    best = None
    for level in quantum_ladder(model):
        try:
            level.count_states(cands, max_states)
        except StateSpaceTooLarge:
            break
        best = level
    return best


def _outcome(level: MarkovModel, search, exact: bool, note: str) -> SearchOutcome:
    ranked = search.ranked()
    return SearchOutcome(search.best, search.best_throughput_tok_s, ranked, level, exact, note)


def _grid_note(level: MarkovModel) -> str:
    q = level.step
    rounding = f", steps rounded by up to {q.max_step_error_ms:.2g} ms" if q.max_step_error_ms else ""
    return f" on a {q.delta_eff_ms:.3g} ms quantum{rounding}"
