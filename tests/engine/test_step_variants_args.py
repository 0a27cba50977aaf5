"""studies/engine/step_variants.py: the rows study's `--rows-cases` list."""

from __future__ import annotations

import pytest
from study_script import load_study


@pytest.fixture(scope="module")
def sv():
    return load_study("studies/engine/step_variants.py")


def test_row_cases_parse_in_order(sv) -> None:
    assert sv.parse_row_cases("1x10, 2x10,3x16") == [(1, 10), (2, 10), (3, 16)]


@pytest.mark.parametrize("bad", ["", "2", "2x", "x10", "0x10", "2x0", "2x10,", "a x10", "2*10"])
def test_row_cases_reject_what_is_not_rows_x_tokens(sv, bad: str) -> None:
    with pytest.raises(SystemExit, match="ROWSxTOKENS"):
        sv.parse_row_cases(bad)
