"""Files users saved with the tools of 2026-12-01 (`tests/fixtures/saved-2026-12-01`, written by that day's
`trsim tune`, `trsim run --dry-run` and `tr calibrate`) still load and mean the same after schema changes.

The simulated numbers below were produced by that day's code on the same files (seed 0, 32 requests of
fixed:100,64 at N = 8): a deployment read through a migrated schema must simulate exactly as it did then."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.calibration.profile import load_profile
from tokenrouter.core.config import load_config
from tokenrouter.sim.run import SimConfig, run_sim

SAVED = Path(__file__).parent / "fixtures" / "saved-2026-12-01"


def _sim(name: str):
    cfg = load_config(SAVED / name)
    return run_sim(SimConfig(deployment=cfg, workload="fixed:100,64", num_requests=32, concurrency=8, seed=0))


def test_tuned_table_keeps_its_rows_and_the_scalar_b():
    cfg = load_config(SAVED / "serve_tuned_v1.yaml")
    policy = cfg.policy.build()
    assert policy.kind == "delayed"
    assert policy.thresholds_for(1, 2) == (1, 1)
    assert policy.thresholds_for(8, 2) == (1, 6)
    assert cfg.notes["tuned_by"] == "trsim tune"


def test_autotune_section_keeps_its_settings():
    cfg = load_config(SAVED / "serve_autotune_v1.yaml")
    at = cfg.policy.autotune
    assert at is not None
    assert (at.verify_s, at.verify_margin, at.max_states, at.min_gain) == (10.0, 0.02, 50_000, 0.03)
    assert cfg.policy.build().thresholds_for(8, 2) == (1, 4)


@pytest.mark.parametrize(
    ("name", "tok_s", "duration_s", "rematch_rows"),
    [
        ("serve_delayed_v1.yaml", 1256.022763331553, 1.6305436969691196, 0),
        ("serve_std_v1.yaml", 895.013992557797, 2.288232381872786, 357),
    ],
)
def test_saved_deployment_simulates_as_it_did(name, tok_s, duration_s, rematch_rows):
    res = _sim(name)
    assert res.summary["total_output_tokens"] == 32 * 64
    assert res.summary["output_throughput_tok_s"] == pytest.approx(tok_s, rel=1e-9)
    assert res.summary["duration_s"] == pytest.approx(duration_s, rel=1e-9)
    # Standard serving re-matches each returning hop's prefix; a routed deployment never does.
    assert res.rematch_rows == rematch_rows


def test_saved_profile_loads_with_its_measurements():
    p = load_profile(str(SAVED / "profile_h200_measured_schema2.json"))
    assert p.gpu.name == "NVIDIA H200"
    assert {"qwen3-0.6b", "qwen3-32b"} <= set(p.models)
