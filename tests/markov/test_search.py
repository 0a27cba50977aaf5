"""Budgeted threshold search: the size estimate bounds the real chain, a search too large says so and falls
back (coarser quantum, grid, scaled from a smaller N) instead of raising, and each fallback stays close to the
exact answer where that can still be computed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tokenrouter.markov.model as model_mod
from tokenrouter.markov import MarkovModel, feasible_thresholds, me_preset, r2r_preset, rstitch_preset
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.markov.search import (
    MAX_ROUNDING,
    evaluate_thresholds,
    quantum_ladder,
    scale_thresholds,
    search_thresholds,
    state_bound,
    threshold_grid,
)


def r2r(n: int, delta: float = 0.1, steps=(6.0, 27.9)) -> MarkovModel:
    return MarkovModel.create(list(steps), *r2r_preset(0.2), n, delta)


def _brute_force_bound(d: list[int], b: tuple[int, ...], n: int) -> int:
    """States (k, b, r) allowed by the constraints, enumerated one by one (d: constant steps in quanta)."""
    m, count = len(d), 0
    for k in itertools.product(range(n + 1), repeat=m):
        for run in itertools.product(range(n + 1), repeat=m):
            if sum(k) + sum(run) != n:
                continue
            if any((run[i] == 0 and k[i] >= b[i]) or (0 < run[i] < b[i]) for i in range(m)):
                continue
            ranges = [range(d[i]) if run[i] else range(1) for i in range(m)]
            count += sum(1 for r in itertools.product(*ranges) if any(run[i] and r[i] == 0 for i in range(m)))
    return count


@pytest.mark.parametrize(("d", "b", "n"), [([2, 5], (1, 1), 3), ([2, 5], (2, 1), 4), ([1, 2, 3], (1, 2, 1), 3)])
def test_state_bound_counts_the_constrained_states(d: list[int], b: tuple, n: int) -> None:
    m = len(d)
    model = MarkovModel.create([float(x) for x in d], np.full((m, m), 1 / m), np.ones((m, m)), n, delta_ms=1.0)
    assert state_bound(model, b) == _brute_force_bound(d, b, n)


@pytest.mark.parametrize(
    "model",
    [
        r2r(6),
        MarkovModel.create([2.0, 9.3], *rstitch_preset(0.35, 0.6), 5),
        MarkovModel.create([0.9, 4.6, 17.0], *me_preset(3), 4, mean_output=20),
        MarkovModel.create([lambda b: 2 + 0.3 * b, lambda b: 9 + b], *r2r_preset(0.4), 5, 0.5),
    ],
)
def test_state_bound_is_an_upper_bound(model: MarkovModel) -> None:
    for b in feasible_thresholds(model.num_models, model.concurrency)[:12]:
        assert model.throughput(b).n_states <= state_bound(model, b)


def test_small_search_is_exact() -> None:
    model = r2r(5)
    out = search_thresholds(model)
    exact = model.best_thresholds()
    assert out.exact and out.note == "" and out.model is model
    assert out.thresholds == exact.best and out.throughput_tok_s == pytest.approx(exact.best_throughput_tok_s)


def test_quantum_ladder_rounds_little_and_ends_with_the_model() -> None:
    model = r2r(4, steps=(6.0, 27.9))
    levels = quantum_ladder(model)
    assert levels[-1] is model and len(levels) > 1
    sizes = [lv.step.max_quanta for lv in levels]
    assert sizes == sorted(set(sizes))
    for lv in levels:
        q = lv.step
        assert np.all(np.abs(q.quanta[:, 1:] * q.delta_eff_ms - q.table_ms) <= MAX_ROUNDING * q.table_ms + 1e-12)


def test_coarser_quantum_fallback_stays_close_to_exact() -> None:
    model = r2r(8)
    exact = model.best_thresholds()
    total = sum(res.n_states for res in exact.results)
    out = search_thresholds(model, max_states=total // 3)
    assert not out.exact and "quantum" in out.note and "all 36 of 36" in out.note
    assert out.model.step.delta_eff_ms > model.step.delta_eff_ms
    # Judge the choice with the exact model: within 1% of the best there is.
    chosen = model.throughput(out.thresholds).throughput_tok_s
    assert chosen >= 0.99 * exact.best_throughput_tok_s


def test_grid_fallback_searches_powers_of_two() -> None:
    # ME chains do not shrink on coarser quanta (deterministic routing): only fewer candidates help.
    model = MarkovModel.create([0.9, 4.6, 17.0], *me_preset(3), 8, mean_output=50)
    full = model.count_states(feasible_thresholds(3, 8))
    out = search_thresholds(model, max_states=full // 2)
    grid = threshold_grid(3, 8)
    assert "grid" in out.note and out.thresholds in grid and len(out.ranked) == len(grid)
    exact = model.best_thresholds()
    assert model.throughput(out.thresholds).throughput_tok_s >= 0.99 * exact.best_throughput_tok_s


def test_scaled_fallback_never_raises_and_explores_little(monkeypatch: pytest.MonkeyPatch) -> None:
    explored: list[int] = []
    real = model_mod.explore

    def counting(*args, **kwargs):
        try:
            ex = real(*args, **kwargs)
        except StateSpaceTooLarge as exc:
            explored.append(exc.max_states)
            raise
        explored.append(len(ex.k))
        return ex

    monkeypatch.setattr(model_mod, "explore", counting)
    model = r2r(64)
    out = search_thresholds(model, max_states=5_000)
    assert "scaled from the search at N=" in out.note
    assert sum(x - 1 for x in out.thresholds) < 64
    # The whole fallback explores a bounded multiple of the budget, not the chain it could not afford.
    assert sum(explored) <= 20 * 5_000


def test_scaled_fallback_predicts_its_b_when_that_chain_fits_the_budget() -> None:
    """The search at N = 16 does not fit 2,000 states, so B comes scaled from N = 8; the chain of that one B fits
    on a coarser quantum, and the outcome carries its throughput (what `trsim tune` prints as Markov tok/s) rather
    than none: the same value `evaluate_thresholds` gives for that B within the same budget."""
    model = r2r(16)
    out = search_thresholds(model, max_states=2_000)
    assert "scaled from the search at N=8" in out.note
    res, _, _ = evaluate_thresholds(model, out.thresholds, 2_000)
    assert out.throughput_tok_s is not None and out.throughput_tok_s == pytest.approx(res.throughput_tok_s)
    assert [r.thresholds for r in out.ranked] == [out.thresholds]


@pytest.mark.parametrize(
    ("b", "frm", "to", "want"),
    [((3, 4), 16, 64, (12, 16)), ((1, 4), 8, 16, (1, 8)), ((16, 1, 1), 16, 32, (32, 1, 1)), ((5, 5), 8, 16, (9, 8))],
)
def test_scale_thresholds(b, frm, to, want) -> None:
    assert scale_thresholds(b, frm, to) == want
    assert sum(x - 1 for x in want) < to


def test_evaluate_coarsens_or_says_too_large() -> None:
    model = r2r(8)
    exact = model.throughput((1, 1))
    res, level, note = evaluate_thresholds(model, (1, 1), max_states=exact.n_states // 2)
    assert level.step.delta_eff_ms > model.step.delta_eff_ms and "quantum" in note
    assert res.throughput_tok_s == pytest.approx(exact.throughput_tok_s, rel=0.02)
    with pytest.raises(StateSpaceTooLarge) as info:
        evaluate_thresholds(model, (1, 1), max_states=10)
    assert isinstance(info.value, ValueError) and "exceeds 10 states" in str(info.value)


def test_cap_stops_exploring_with_a_value_error() -> None:
    with pytest.raises(StateSpaceTooLarge):
        r2r(8).throughput((1, 1), max_states=100)


def test_huge_feasible_sets_are_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenrouter.markov.search as search_mod

    listed: list[int] = []
    real = search_mod.feasible_thresholds
    monkeypatch.setattr(search_mod, "feasible_thresholds", lambda m, n: listed.append(n) or real(m, n))
    model = MarkovModel.create([0.9, 1.2, 2.0, 4.6, 17.0], *me_preset(5), 64, mean_output=100)
    out = search_thresholds(model, max_states=5_000)
    assert "too many to list" in out.note and 64 not in listed  # C(68, 5) = 10,424,128 candidates
    assert len(out.thresholds) == 5 and sum(x - 1 for x in out.thresholds) < 64
