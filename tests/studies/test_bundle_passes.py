"""studies/calibration/bundle_passes.py: a calibration's graph pass tables replace the bundled ones, nothing else
does, and the bundled profile still loads and prices steps with them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from study_script import load_study

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "calibration/profiles/h200-measured.json"
MODELS = ("qwen3-0.6b", "qwen3-32b")


@pytest.fixture(scope="module")
def mod():
    return load_study("studies/calibration/bundle_passes.py")


def _scaled_source(prof: dict, factor: float) -> dict:
    """A profile whose every pass and step coefficient is the bundled one times `factor` (eager and host too)."""
    src = copy.deepcopy(prof)
    for name in MODELS:
        m = src["models"][name]
        for key in ("decode", "varlen", "eager"):
            for p in m["passes"][key]["points"]:
                p["ms"] *= factor
        for kind in ("graph", "eager"):
            m["step"][kind]["c0"] *= factor
        m["host"]["c0_ms"] *= factor
    return src


def test_only_graph_tables_move(mod):
    prof = json.loads(BUNDLED.read_text())
    before = copy.deepcopy(prof)
    out = mod.bundle(prof, _scaled_source(prof, 0.5), "src.json")
    for name in MODELS:
        new, old = out["models"][name], before["models"][name]
        for key in ("decode", "varlen"):
            got = [p["ms"] for p in new["passes"][key]["points"]]
            assert got == [p["ms"] * 0.5 for p in old["passes"][key]["points"]]
        assert new["step"]["graph"]["c0"] == old["step"]["graph"]["c0"] * 0.5
        assert new["passes"]["eager"] == old["passes"]["eager"]
        assert new["step"]["eager"] == old["step"]["eager"] and new["host"] == old["host"]
    others = [m for m in before["models"] if m not in MODELS]
    assert others and all(out["models"][m] == before["models"][m] for m in others)
    assert out["runtime"] == before["runtime"] and out["colocation"] == before["colocation"]
    assert "src.json" in out["notes"]["graph_passes"]


def test_another_model_is_refused(mod):
    prof = json.loads(BUNDLED.read_text())
    src = copy.deepcopy(prof)
    src["models"]["qwen3-0.6b"]["weight_bytes"] += 2
    with pytest.raises(ValueError, match="another model"):
        mod.bundle(prof, src, "src.json")


def test_bundled_profile_prices_decode_steps_as_the_calibration_measured(mod, tmp_path):
    """The calibration bundled into the profile (2026-12-04, varlen passes of <= 32 tokens on the skinny GEMM): the
    cost model prices the 0.6B's and the 32B's one-row decode graph steps within 5% of the times that run measured
    (its raw points, not its fit)."""
    from calibration.cost import CostModel
    from calibration.step_stats import StepStats

    source = ROOT / "studies/calibration/passes-2026-12-04-varlen32/h200-passes.json"
    src = json.loads(source.read_text())
    out = tmp_path / "bundled.json"
    out.write_text(json.dumps(mod.bundle(json.loads(BUNDLED.read_text()), src, "src.json")))
    cost = CostModel(out)
    for name in MODELS:
        point = next(p for p in src["models"][name]["passes"]["decode"]["points"] if p["rows"] == 1)
        step = StepStats.one_pass(1, 1, context_tokens=point["context_tokens"], graph=True)
        assert cost.for_model(name).step_ms(step) == pytest.approx(point["ms"], rel=0.05), name
