"""A profile measured on CPU says so (`Profile.device`), and fits too poor to price steps with are named (issue 32,
item 3)."""

from __future__ import annotations

import json

import msgspec

from tokenrouter.calibration import load_profile
from tokenrouter.calibration.fit_quality import poor_fits
from tokenrouter.calibration.measured import FitError
from tokenrouter.calibration.profile import Profile


def test_a_gpu_profile_has_no_poor_fits():
    """The bundled H200 calibration: every fit predicts its held-out points well enough to stay quiet."""
    assert poor_fits(load_profile("h200")) == []


def _with_errors(prof: Profile, model: str, kind: str, err: FitError) -> Profile:
    m = prof.models[model]
    tab = getattr(m.passes, kind)
    tab = msgspec.structs.replace(tab, errors={**tab.errors, tab.fit: err})
    passes = msgspec.structs.replace(m.passes, **{kind: tab})
    return msgspec.structs.replace(prof, models={**prof.models, model: msgspec.structs.replace(m, passes=passes)})


def test_a_pass_fit_that_misses_its_held_out_points_is_named():
    prof = load_profile("h200")
    bad = _with_errors(prof, "qwen3-0.6b", "decode", FitError(median=1.676, max=1.676, points=1))
    lines = poor_fits(bad)
    assert len(lines) == 1 and lines[0].startswith("qwen3-0.6b decode passes:") and "168%" in lines[0], lines
    # at the limit it stays quiet: 50% is what the warning allows
    assert poor_fits(_with_errors(prof, "qwen3-0.6b", "decode", FitError(median=0.5, max=0.5, points=1))) == []


def test_a_co_location_grid_with_a_poor_interpolation_is_named():
    prof = load_profile("h200")
    g = prof.colocation[0]
    worse = msgspec.structs.replace(g, errors={**g.errors, "interp": FitError(median=0.519, max=0.992, points=8)})
    lines = poor_fits(msgspec.structs.replace(prof, colocation=[worse, *prof.colocation[1:]]))
    assert lines == [f"co-location {g.model_a}+{g.model_b} ({g.arrangement}): interpolation misses held-out cells "
                     "by 99% (median 52% over 8)"]  # fmt: skip


def test_the_cpu_mark_is_saved_and_read_back(tmp_path):
    prof = load_profile("h200")
    assert not prof.made_on_cpu and "device" not in json.loads(prof.to_json())  # a GPU's profile has no such field
    path = msgspec.structs.replace(prof, device="cpu").save(tmp_path / "cpu.json")
    assert load_profile(path).made_on_cpu
