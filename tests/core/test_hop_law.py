"""The `markov` router's hop law (core/hop_law.py): r-stitch with p = 1/mean_small_run (the small model hands off)
and q = 1/mean_large_run (the large model hands back). References are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tokenrouter.core.hop_law import hop_law


def test_markov_router_stays_on_each_model_for_its_own_mean_run() -> None:
    # The small model writes runs of mean 4 tokens: it hands off w.p. 1/4 per step and stays w.p. 3/4; the
    # large one writes runs of mean 2: it hands back w.p. 1/2.
    law = hop_law("markov", mean_small_run=4.0, mean_large_run=2.0)
    assert np.array(law.routing) == pytest.approx(np.array([[0.75, 0.25], [0.5, 0.5]]))
    assert law.commit == ((True, False), (True, True))  # r-stitch: the small token of a hop is dropped


def test_a_large_run_of_one_token_is_r2r() -> None:
    # A large run of exactly one token is R2R's hand-back; a small run of mean 10 is its hop rate 0.1.
    assert hop_law("markov", mean_small_run=10.0, mean_large_run=1.0) == hop_law("r2r", hop_rate=0.1)
    law = hop_law("markov", mean_small_run=10.0, mean_large_run=1.0)
    assert np.array(law.routing) == pytest.approx(np.array([[0.9, 0.1], [1.0, 0.0]]))


def test_the_share_of_steps_on_the_small_model_is_its_share_of_the_runs() -> None:
    # Alternating runs of mean 5 (small) and 1.25 (large): a fraction 5 / 6.25 = 0.8 of steps is on the small
    # model. For a two-state chain that share is P[1][0] / (P[0][1] + P[1][0]).
    p = hop_law("markov", mean_small_run=5.0, mean_large_run=1.25).routing
    assert p[1][0] / (p[0][1] + p[1][0]) == pytest.approx(0.8)


@pytest.mark.parametrize(("small", "large"), [(0.5, 2.0), (2.0, 0.9), (None, 2.0), (3.0, None)])
def test_mean_runs_below_one_token_or_missing_are_refused(small, large) -> None:
    with pytest.raises(ValueError, match="mean run lengths"):
        hop_law("markov", mean_small_run=small, mean_large_run=large)
