"""studies/serving/sm_share.py: the cell parser, the ABBA order of the splits and the gap to the uncapped split."""

from __future__ import annotations

import pandas as pd
import pytest
from study_script import load_study


@pytest.fixture(scope="module")
def sm():
    return load_study("studies/serving/sm_share.py")


def test_cells_parse_and_a_malformed_one_is_a_clear_error(sm):
    assert sm.parse_cells("8:3,6;64:23,42;") == [(8, "3,6"), (64, "23,42")]
    with pytest.raises(SystemExit, match="not N:B"):
        sm.parse_cells("8-3,6")


def test_splits_alternate_their_order_on_every_other_repeat(sm):
    order = sm.split_order(["100,100", "100,90", "100,80"], 3)
    assert [s for _, s in order] == ["100,100", "100,90", "100,80", "100,80", "100,90", "100,100",
                                     "100,100", "100,90", "100,80"]  # fmt: skip
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_gap_is_each_splits_mean_against_the_uncapped_mean_of_the_same_cell(sm):
    df = pd.DataFrame([
        {"split": "100,100", "N": 8, "B": "3,6", "tok_s": 1500.0},
        {"split": "100,100", "N": 8, "B": "3,6", "tok_s": 1520.0},
        {"split": "100,80", "N": 8, "B": "3,6", "tok_s": 1530.0},
        {"split": "100,80", "N": 64, "B": "23,42", "tok_s": 4400.0},  # no uncapped load of this cell
    ])  # fmt: skip
    g = sm.gaps(df).set_index(["N", "split"])
    assert g.loc[(8, "100,100"), "vs_base"] == 0.0
    assert g.loc[(8, "100,80"), "vs_base"] == pytest.approx(1530.0 / 1510.0 - 1.0)
    assert g.loc[(8, "100,100"), "count"] == 2
    assert pd.isna(g.loc[(64, "100,80"), "vs_base"])


def test_loop_columns_name_each_models_step_and_rows(sm):
    from headline import loop_columns  # sm_share's shared helper (studies/serving/headline.py)

    loops = {"a": {"step_ms": 1.5, "rows_per_step": 4.0, "overhead_frac": 0.1}, "b": {"step_ms": 20.0,
             "rows_per_step": None}}  # fmt: skip
    assert loop_columns(loops) == {"a_step_ms": 1.5, "a_rows_per_step": 4.0, "b_step_ms": 20.0,
                                   "b_rows_per_step": None}  # fmt: skip
