"""A tuned B(N) table read at a live N between, below and above its rows (`core.policy.table_thresholds`).

References by hand. The table is what `trsim tune -n 1,8,16` writes for the bundled pair at hop 0.1: rows 1, 8, 16.
Before this rule a live N of 2..7 ran row 1, (1, 1), the B tuned for one request."""

from __future__ import annotations

import pytest

from tokenrouter.core.policy import Policy, scale_thresholds, table_thresholds

TABLE = {1: (1, 1), 8: (3, 6), 16: (4, 11)}


@pytest.mark.parametrize(
    ("n", "want"),
    [
        (1, (1, 1)),
        (8, (3, 6)),
        (16, (4, 11)),
        # between 1 and 8: B_i = row1 + (n - 1) / 7 * (row8 - row1), rounded half up
        (2, (1, 2)),  # 1 + 2/7 = 1.29 -> 1;  1 + 5/7 = 1.71 -> 2
        (4, (2, 3)),  # 1 + 6/7 = 1.86 -> 2;  1 + 15/7 = 3.14 -> 3
        (7, (3, 5)),  # 1 + 12/7 = 2.71 -> 3; 1 + 30/7 = 5.29 -> 5
        # between 8 and 16: w = (n - 8) / 8
        (12, (4, 9)),  # 3 + 0.5 = 3.5 -> 4; 6 + 2.5 = 8.5 -> 9
        (9, (3, 7)),  # 3.125 -> 3; 6.625 -> 7
        # above the last row: row 16 scaled by n / 16, half up
        (32, (8, 22)),
        (24, (6, 17)),  # 4 * 1.5 = 6; 11 * 1.5 = 16.5 -> 17
    ],
)
def test_a_live_n_between_rows_interpolates(n, want):
    assert table_thresholds(TABLE, n) == want


def test_below_the_first_row_runs_the_first_row():
    assert table_thresholds({4: (2, 3), 8: (3, 6)}, 2) == (2, 3)


def test_the_served_b_is_the_interpolated_one_clamped_by_the_guard():
    policy = Policy("delayed", table=TABLE)
    assert policy.thresholds_for(4, 2) == (2, 3)  # sum(B_i - 1) = 3 < 4: as interpolated
    assert policy.thresholds_for(2, 2) == (1, 2)  # 1 < 2
    tight = Policy("delayed", table={1: (1, 1), 8: (5, 4)})
    # N = 6: 1 + 20/7 = 3.86 -> 4, 1 + 15/7 = 3.14 -> 3; sum 5 < 6 holds. N = 5: (3, 3), sum 4 < 5 holds.
    assert tight.thresholds_for(6, 2) == (4, 3) and tight.thresholds_for(5, 2) == (3, 3)


def test_scaling_keeps_an_eager_model_eager_and_clamps():
    assert scale_thresholds((1, 6), 8, 32) == (1, 24)
    # (8, 8) at N = 8 carried to 16: (16, 16), then sum(B_i - 1) < 16 lowers the largest, the last on ties
    assert scale_thresholds((8, 8), 8, 16) == (9, 8)
