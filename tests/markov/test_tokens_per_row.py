"""`colocation.tokens_per_row`: the mean tokens a row feeds on each of two models, worked out by hand.

A visit to model i lasts r_i = 1 / (1 - P_ii) steps on average. Its first step feeds what the peer wrote during
its own run (r_j tokens), the other r_i - 1 steps feed one token each: r_j + r_i - 1 tokens over r_i rows."""

from __future__ import annotations

import numpy as np
import pytest

from tokenrouter.markov.colocation import tokens_per_row


@pytest.mark.parametrize(
    ("P", "want"),
    [
        # R2R at p = 0.1: r = (10, 1). Small: (1 + 10 - 1) / 10 = 1 token; large: (10 + 1 - 1) / 1 = 10.
        ([[0.9, 0.1], [1.0, 0.0]], [1.0, 10.0]),
        # r = (5, 2). Small: (2 + 5 - 1) / 5 = 6/5; large: (5 + 2 - 1) / 2 = 3.
        ([[0.8, 0.2], [0.5, 0.5]], [1.2, 3.0]),
        # r = (10, 4). Small: (4 + 10 - 1) / 10 = 1.3; large: 13 / 4 = 3.25.
        ([[0.9, 0.1], [0.25, 0.75]], [1.3, 3.25]),
        # Strict alternation: r = (1, 1), one token a row on both.
        ([[0.0, 1.0], [1.0, 0.0]], [1.0, 1.0]),
    ],
)
def test_tokens_per_row_by_hand(P, want) -> None:
    assert tokens_per_row(np.array(P)) == pytest.approx(want)


def test_both_models_feed_the_same_tokens_per_visit() -> None:
    # A visit to either model feeds the tokens of one small run and one large run, less the one they share, so
    # r_i x tokens_per_row_i is the same for both: (r_0 + r_1 - 1) = 3 + 6 - 1 = 8 for P_00 = 2/3, P_11 = 5/6.
    small, large = tokens_per_row(np.array([[2 / 3, 1 / 3], [1 / 6, 5 / 6]]))
    assert 3 * small == pytest.approx(8.0) and 6 * large == pytest.approx(8.0)


def test_an_ensemble_feeds_one_token_per_row() -> None:
    assert tokens_per_row(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float)) == [1.0, 1.0, 1.0]
