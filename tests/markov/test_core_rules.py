"""The Markov model applies the core's rules (deadlock guard, clamp, check), not copies of them.

Each test swaps the core's guard for a stricter rule and checks that the Markov side follows: a private copy of
sum_i (B_i - 1) < N in `tokenrouter.markov` would keep the old answer and fail here. The expected values are
worked out by hand from the swapped rule."""

from __future__ import annotations

import pytest

import tokenrouter.core.policy as core_policy
from tokenrouter.markov import MarkovModel, feasible_thresholds, r2r_preset
from tokenrouter.markov.search import scale_thresholds, threshold_grid
from tokenrouter.markov.steps import live_thresholds


def _half_guard(thresholds, concurrency) -> bool:
    """A stricter guard than the core's: the waiting slack may use only half of N, 2 * sum_i (B_i - 1) < N."""
    return 2 * sum(b - 1 for b in thresholds) < concurrency


@pytest.fixture
def half_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_policy, "guard_holds", _half_guard)


def test_feasible_set_and_grid_follow_the_core_guard(half_guard) -> None:
    # N = 6: 2 * sum(B_i - 1) < 6 means sum(B_i - 1) <= 2.
    assert feasible_thresholds(2, 6) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]
    assert len(feasible_thresholds(3, 4)) == 4  # sum <= 1: (1,1,1) and one entry at 2
    assert threshold_grid(2, 6) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # entries in {1, 2, 4, 6}


def test_the_whole_search_lists_the_core_guards_set(half_guard) -> None:
    model = MarkovModel.create([1.0, 3.0], *r2r_preset(0.2), 6, mean_output=20)
    search = model.best_thresholds()
    assert [res.thresholds for res in search.results] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]


def test_check_follows_the_core_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    model = MarkovModel.create([1.0, 3.0], *r2r_preset(0.2), 6)
    assert model.check_thresholds((3, 2)) == (3, 2)  # core guard: 3 < 6
    monkeypatch.setattr(core_policy, "guard_holds", _half_guard)
    with pytest.raises(ValueError, match="deadlock guard"):
        model.check_thresholds((3, 2))  # 2 * 3 = 6, not < 6


def test_live_and_scaled_thresholds_follow_the_core_clamp(half_guard) -> None:
    # (4, 3) at live 6 needs sum(B_i - 1) <= 2; the clamp lowers the largest (last on ties): (3,3) (3,2) (2,2).
    assert live_thresholds((4, 3), 6) == (2, 2)
    assert live_thresholds((1, 5), 3) == (1, 2)  # sum <= 1
    # (4, 4) scaled from N = 4 to 8 is (8, 8); sum(B_i - 1) <= 3 and the clamp lowers the last on ties:
    # (8,7) (7,7) (7,6) (6,6) (6,5) (5,5) (5,4) (4,4) (4,3) (3,3) (3,2).
    assert scale_thresholds((4, 4), 4, 8) == (3, 2)


def test_live_thresholds_follow_a_swapped_clamp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_policy, "clamp_thresholds", lambda b, n: (1,) * len(b))  # "eager below N"
    assert live_thresholds((3, 2), 5) == (1, 1)
