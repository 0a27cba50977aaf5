"""studies/autotune/acceptance.py: the combined acceptance summary (worst shift gap, stable cost, lost requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_script import load_study


@pytest.fixture(scope="module")
def acc():
    return load_study("studies/autotune/acceptance.py")


def _run(tmp_path: Path, name: str, **keys) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"date": "2026-12-04", "gpu": "H200", **keys}))
    return d


def test_combines_the_worst_gap_the_stable_cost_and_every_lost_request(acc, tmp_path):
    hop = _run(tmp_path, "hop", worst_gap_after_shift=0.005, stable_cost=0.0136, lost_requests=0.0)
    ramp = _run(tmp_path, "ramp", worst_gap_after_shift=0.0135, stable_cost=None, lost_requests=1.0)
    st = _run(tmp_path, "stable", worst_gap_after_shift=None, stable_cost=-0.0008, lost_requests=2.0)
    out = tmp_path / "acc"
    rc = acc.main(["--shift", str(hop), "--shift", str(ramp), "--stable", str(st), "--out", str(out)])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 0
    assert s["worst_gap_after_shift"] == 0.0135  # the ramp's, the larger of the two shift runs
    # The stable cost is the stable run's, not the hop run's one-phase figure.
    assert s["stable_cost"] == -0.0008
    assert s["lost_requests"] == 3.0
    assert s["meets"] == {"worst_gap_after_shift": True, "stable_cost": True, "lost_requests": False}
    assert [x["run"] for x in s["sources"]["shift"]] == [str(hop), str(ramp)]


def test_a_part_no_run_measured_stays_unknown(acc, tmp_path):
    st = _run(tmp_path, "stable", stable_cost=0.02, lost_requests=None)
    s = acc.combine({}, {st: json.loads((st / "summary.json").read_text())})
    assert s["worst_gap_after_shift"] is None and s["meets"]["worst_gap_after_shift"] is None
    assert s["meets"]["stable_cost"] is False  # 2% over the 1% bar
    assert s["lost_requests"] is None  # a run that did not count cannot be read as zero


def test_the_worst_of_several_stable_runs_counts(acc, tmp_path):
    a = {"stable_cost": 0.004, "lost_requests": 0.0}
    b = {"stable_cost": 0.012, "lost_requests": 0.0}
    assert acc.combine({}, {Path("a"): a, Path("b"): b})["stable_cost"] == 0.012


def test_a_missing_summary_is_a_clear_error(acc, tmp_path):
    with pytest.raises(SystemExit, match=r"no summary\.json"):
        acc.main(["--stable", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
