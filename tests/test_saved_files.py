"""Files users saved with the tools of 2026-12-01 (`tests/fixtures/saved-2026-12-01`, written by that day's
`trsim tune`, `trsim run --dry-run` and `tr calibrate`) still load and mean the same after schema changes.

A deployment read through a migrated schema must simulate exactly as the same deployment made with today's
command line (seed 0, 32 requests of fixed:100,64 at N = 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tokenrouter.calibration.resolve import load_profile
from tokenrouter.core.config import CONFIG_VERSION, ConfigError, load_config
from tokenrouter.deploy.overrides import DeploymentOverrides, resolve_deployment
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
    ("name", "flags", "rematched"),
    [
        ("serve_delayed_v1.yaml", {"policy": "delayed", "thresholds": [1, 4], "hop_rate": 0.1}, False),
        ("serve_std_v1.yaml", {"policy": "std-serving", "hop_rate": 0.1}, True),
    ],
)
def test_saved_deployment_simulates_as_the_same_deployment_made_today(name, flags, rematched):
    """The migrated file and the deployment its fields describe, as today's command line builds it, simulate
    identically (the same seeded run, to the last digit): migration changed nothing the simulator reads."""
    res = _sim(name)
    today = resolve_deployment(None, DeploymentOverrides(**flags))
    ref = run_sim(SimConfig(deployment=today, workload="fixed:100,64", num_requests=32, concurrency=8, seed=0))
    assert res.summary["total_output_tokens"] == 32 * 64
    assert res.summary == ref.summary
    # Standard serving re-matches each returning hop's prefix; a routed deployment never does.
    assert (res.rematch_rows > 0) is rematched
    assert res.rematch_rows == ref.rematch_rows


def test_a_v1_std_serving_file_loads_as_the_baseline_and_saves_as_the_current_version(tmp_path):
    cfg = load_config(SAVED / "serve_std_v1.yaml")
    assert cfg.baseline == "std-serving" and cfg.policy.kind == "eager"
    assert cfg.version == CONFIG_VERSION == 2
    cfg.save(tmp_path / "again.yaml")
    again = yaml.safe_load((tmp_path / "again.yaml").read_text())
    assert again["version"] == 2 and again["baseline"] == "std-serving" and again["policy"]["kind"] == "eager"
    assert load_config(tmp_path / "again.yaml") == cfg


@pytest.mark.parametrize("name", ["serve_tuned_v1.yaml", "serve_delayed_v1.yaml", "serve_autotune_v1.yaml"])
def test_other_v1_files_read_back_unchanged_but_for_the_version(name):
    raw = yaml.safe_load((SAVED / name).read_text())
    # Fields added since then come back at their defaults: the deployment's `baseline`, each model's `profile`,
    # autotune's search budget and latency target.
    models = [{**m, "profile": None} for m in raw["models"]]
    expected = {**raw, "models": models, "version": 2, "baseline": None}
    if raw["policy"].get("autotune"):
        autotune = {**raw["policy"]["autotune"], "search_s": 4.0, "slo_tpot_ms": None}
        expected["policy"] = {**raw["policy"], "autotune": autotune}
    assert yaml.safe_load(load_config(SAVED / name).to_yaml()) == expected


def test_a_file_of_a_future_version_is_a_one_line_error(tmp_path):
    path = tmp_path / "future.yaml"
    path.write_text((SAVED / "serve_delayed_v1.yaml").read_text().replace("version: 1", "version: 3"))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "version 3" in str(e.value) and "\n" not in str(e.value)


def test_saved_profile_loads_with_its_measurements():
    p = load_profile(str(SAVED / "profile_h200_measured_schema2.json"))
    assert p.gpu.name == "NVIDIA H200"
    assert {"qwen3-0.6b", "qwen3-32b"} <= set(p.models)
