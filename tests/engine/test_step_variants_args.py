"""studies/engine/step_variants.py: the rows study's `--rows-cases` list."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "studies" / "engine" / "step_variants.py"


@pytest.fixture(scope="module")
def sv():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("step_variants", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_row_cases_parse_in_order(sv) -> None:
    assert sv.parse_row_cases("1x10, 2x10,3x16") == [(1, 10), (2, 10), (3, 16)]


@pytest.mark.parametrize("bad", ["", "2", "2x", "x10", "0x10", "2x0", "2x10,", "a x10", "2*10"])
def test_row_cases_reject_what_is_not_rows_x_tokens(sv, bad: str) -> None:
    with pytest.raises(SystemExit, match="ROWSxTOKENS"):
        sv.parse_row_cases(bad)
