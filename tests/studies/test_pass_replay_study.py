"""studies/decider/pass_replay.py: which logged passes it replays, and the gap sweep's records (tiny pair, CPU)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from study_script import ROOT, load_study

FOLDER = ROOT / "studies" / "decider"


@pytest.fixture(scope="module")
def study():
    sys.path.insert(0, str(FOLDER))  # it imports pass_times from its folder
    try:
        yield load_study(FOLDER / "pass_replay.py")
    finally:
        sys.path.remove(str(FOLDER))


def _step(model, launch, tokens):
    return {"model": model, "launch": launch, "tokens": tokens}


def test_steady_keeps_the_middle_of_a_load_and_the_token_range(study):
    steps = [_step(m, t, tok) for t in range(100) for m, tok in ((0, 40), (1, 500 if t % 2 else 2048))]
    mark = {"t0": 0.0, "t1": 99.0}
    kept = study.steady(steps, mark, 1, (64, 1024))
    # model 1 only, 2,048-token prefills left out, launches within [9.9, 89.1]
    assert [s["launch"] for s in kept] == [t for t in range(10, 90) if t % 2]
    assert all(s["model"] == 1 and s["tokens"] == 500 for s in kept)


def test_pick_spreads_per_b_passes_over_each_load(study):
    steps = [_step(1, t, 300) for t in range(200)]
    marks = [{"B": [3, 6], "t0": 0.0, "t1": 99.0}, {"B": [5, 12], "t0": 100.0, "t1": 199.0}]
    got = study.pick(steps, marks, 1, 4, (64, 1024))
    assert list(got) == ["3,6", "5,12"]
    first = [s["launch"] for s in got["3,6"]]
    assert len(first) == 4 and first[0] == 10 and all(b - a == 20 for a, b in itertools.pairwise(first))
    assert all(100 <= s["launch"] <= 199 for s in got["5,12"])


def test_parse_shapes(study):
    assert study.parse_shapes("36x13@230,8x1@1024") == [(36, 13, 230), (8, 1, 1024)]


def test_gap_sweep_on_cpu_records_every_shape_and_gap_twice(tmp_path):
    cmd = [sys.executable, "pass_replay.py", "--config", "../serving/headline.yaml", "--steps",
           "live-2026-12-03-n64-sweep", "--out", str(tmp_path), "--device", "cpu", "--smoke", "--reps", "2",
           "--gap-sweep", "2x3@16,1x1@8", "--gaps", "0,3"]  # fmt: skip
    p = subprocess.run(cmd, cwd=FOLDER, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    sweep = json.loads((tmp_path / "pass_replay.json").read_text())["gap_sweep"]
    keys = sorted((r["round"], r["rows"], r["tokens"], r["ctx"], r["gap_ms"]) for r in sweep)
    assert keys == sorted((k, *shape, g) for k in (0, 1) for shape in ((2, 3, 16), (1, 1, 8)) for g in (0.0, 3.0))
    for r in sweep:
        assert r["ms"] > 0 and r["duty"] == pytest.approx(r["ms"] / (r["ms"] + r["gap_ms"]), abs=1e-3)
    assert p.stdout.splitlines()[0].startswith("rows x tokens")
