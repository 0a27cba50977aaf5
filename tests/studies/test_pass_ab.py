"""studies/serving/curve/pass_ab.py: two runs' passes compared shape by shape, after a cell's window."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from study_script import load_study


@pytest.fixture(scope="module")
def mod():
    return load_study("studies/serving/curve/pass_ab.py")


def _run(tmp_path: Path, name: str, passes: list[tuple[float, list[int], list[int], float]]) -> Path:
    """A run folder: cells.json with one cell ending at t = 10, large-model step logs (launch, tokens, ctx, ms)."""
    d = tmp_path / name
    (d / "steps_routed").mkdir(parents=True)
    (d / "cells.json").write_text(json.dumps({"servers": None, "routed/8/256": {"window": [0.0, 10.0]}}))
    recs = [{"model": 1, "launch": t, "done": t + ms / 1e3, "rows": len(tok), "row_tokens": tok, "row_ctx": ctx,
             "gpu_ms": ms} for t, tok, ctx, ms in passes]  # fmt: skip
    small = {"model": 0, "launch": 11.0, "done": 11.001, "rows": 1, "row_tokens": [1], "row_ctx": [300], "gpu_ms": 1.0}
    lines = [json.dumps(r) for r in recs] + ["{cut short"]
    (d / "steps_routed" / "steps1.jsonl").write_text("\n".join(lines) + "\n")
    (d / "steps_routed" / "steps0.jsonl").write_text(json.dumps(small) + "\n")
    return d


def test_shapes_are_compared_after_the_cell_and_long_rows_left_out(mod, tmp_path):
    # 2 rows at ~3k keys: A 30 ms, B 24 ms; 1 row at ~500 keys: A 20, B 21; passes before t = 10 or with a 40-token
    # row differ wildly and must not count.
    def passes(before: float, two: float, n_two: int, one: float, n_one: int, long: float) -> list:
        two_rows = [(11.0 + i, [10, 9], [3000, 3100], two) for i in range(n_two)]
        one_row = [(20.0 + i, [5], [500], one) for i in range(n_one)]
        return [(1.0, [10, 10], [3000, 3100], before), *two_rows, *one_row, (30.0, [40, 1], [3000, 3000], long)]

    a = _run(tmp_path, "a", passes(99.0, 30.0, 3, 20.0, 2, 80.0))
    b = _run(tmp_path, "b", passes(1.0, 24.0, 2, 21.0, 3, 5.0))
    out = tmp_path / "ab.csv"
    assert mod.main([str(a), str(b), "--after", "routed/8/256", "--min-passes", "2", "--out", str(out)]) == 0
    t = pd.read_csv(out).set_index(["rows", "ctx_lo"])
    assert list(t.index) == [(1, 0), (2, 2000)]
    assert t.loc[(2, 2000), "ms_a"] == pytest.approx(30.0) and t.loc[(2, 2000), "ms_b"] == pytest.approx(24.0)
    assert t.loc[(2, 2000), "change_pct"] == pytest.approx(-20.0)
    assert (t.loc[(1, 0), "passes_a"], t.loc[(1, 0), "passes_b"]) == (2, 3)
    assert t.loc[(1, 0), "change_pct"] == pytest.approx(5.0)
    # Without the cut, the pass before the cell joins its shape's mean.
    assert mod.main([str(a), str(b), "--min-passes", "2", "--out", str(out)]) == 0
    assert pd.read_csv(out).set_index(["rows", "ctx_lo"]).loc[(2, 2000), "ms_a"] == pytest.approx((99 + 90) / 4)
    # Shapes seen fewer than --min-passes times on a side are dropped.
    assert mod.main([str(a), str(b), "--after", "routed/8/256", "--min-passes", "3", "--out", str(out)]) == 1


def test_unknown_cell_is_a_clear_error(mod, tmp_path):
    a = _run(tmp_path, "a", [(11.0, [5], [500], 20.0)])
    with pytest.raises(SystemExit, match=r"no cell 'routed/8/8192'.*routed/8/256"):
        mod.main([str(a), str(a), "--after", "routed/8/8192"])
