"""Deployment YAML loading: a key the schema lacks or a number out of its range is a one-line ConfigError,
never a silent default or a crash deep in the simulator."""

from __future__ import annotations

import pytest

from tokenrouter.core.config import (
    AutotuneConfig,
    ConfigError,
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    SchedulerConfig,
    config_from_yaml,
)
from tokenrouter.core.policy import PolicyKind

PAIR = "models: [{name: qwen3-0.6b}, {name: qwen3-32b}]\n"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (PAIR + "polcy: {kind: eager}\n", ["`polcy`", "`$`", "`policy`"]),
        (PAIR + "policy: {kind: delayed, threshold: [1, 4]}\n", ["`threshold`", "`$.policy`", "`thresholds`"]),
        ("models: [{name: qwen3-0.6b, gpu: [1]}, {name: qwen3-32b}]\n", ["`gpu`", "`$.models[0]`", "`gpus`"]),
        (PAIR + "policy: {kind: delayed, autotune: {interval: 2}}\n", ["`interval`", "`$.policy.autotune`"]),
        (PAIR + "scheduler: {pagesize: 32}\n", ["`pagesize`", "`$.scheduler`", "`page_size`"]),
        (PAIR + "router: {name: r2r, zzz: 1}\n", ["`zzz`", "`$.router`"]),
    ],
)
def test_unknown_key_is_an_error_naming_it_and_where(text, needles):
    with pytest.raises(ConfigError) as e:
        config_from_yaml(text)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_every_written_key_reads_back_and_notes_stay_free_form():
    dep = DeploymentConfig([ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")], notes={"anything": {"x": 1}})
    back = config_from_yaml(dep.to_yaml())
    assert back == dep


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (PAIR + "placement: {mode: cross-host, link_bandwidth_gbps: 0}\n", "link_bandwidth_gbps"),
        (PAIR + "placement: {mode: cross-host, link_bandwidth_gbps: .nan}\n", "link_bandwidth_gbps"),
        (PAIR + "placement: {mode: cross-host, link_latency_ms: -1}\n", "link_latency_ms"),
        ("models: [{name: qwen3-0.6b, kv_budget_gb: -3}, {name: qwen3-32b}]\n", "kv_budget_gb"),
        ("models: [{name: qwen3-0.6b, mps_active_thread_percentage: 150}, {name: qwen3-32b}]\n",
         "mps_active_thread_percentage"),
        ("models: [{name: qwen3-0.6b, mps_active_thread_percentage: 0}, {name: qwen3-32b}]\n",
         "mps_active_thread_percentage"),
        (PAIR + "policy: {kind: delayed, max_wait_ms: .nan}\n", "max_wait"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_are_errors(text, needle):
    with pytest.raises(ConfigError) as e:
        config_from_yaml(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (PAIR + "policy: {kind: delayed, table: {8: [1, 2, 3]}}\n", "one value per model"),
        (PAIR + "policy: {kind: delayed, thresholds: [1, 2, 3]}\n", "one value per model"),
        (PAIR + "policy: {kind: delayed, table: {4: [1, 5]}}\n", "deadlock guard"),
        (PAIR + "policy: {kind: delayed, thresholds: [0, 2]}\n", ">= 1"),
        (PAIR + "version: 2\npolicy: {kind: std-serving}\n", "'std-serving' - at `$.policy.kind`"),
        (PAIR + "version: 2\nbaseline: std-serving\npolicy: {kind: delayed}\n", "eager"),
        (PAIR + "version: 2\nbaseline: llm-only\npolicy: {kind: eager}\n", "tr serve --baseline"),
        (PAIR + "baseline: std-serving\npolicy: {kind: eager, autotune: {}}\n", "autotune"),
    ],
)
def test_policy_and_baseline_are_checked_in_one_place(text, needle):
    with pytest.raises(ConfigError) as e:
        config_from_yaml(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_file_without_version_reads_as_version_1():
    dep = config_from_yaml(PAIR + "policy: {kind: std-serving}\n")
    assert dep.version == 2 and dep.baseline == "std-serving" and dep.policy.kind == "eager"


def test_with_thresholds_returns_a_new_delayed_policy_without_the_old_table():
    pc = PolicyConfig("eager", [1, 2], {1: [1, 1], 8: [1, 3]}, max_wait_ms=5.0, autotune=AutotuneConfig())
    tuned = pc.with_thresholds((1, 4))
    assert tuned == PolicyConfig("delayed", [1, 4], {}, 5.0, AutotuneConfig())
    assert pc.kind == "eager" and pc.table == {1: [1, 1], 8: [1, 3]}  # unchanged
    assert pc.with_thresholds((1, 4), {8: (1, 6)}).build().thresholds_for(8, 2) == (1, 6)
    with pytest.raises(ConfigError, match="deadlock guard"):
        pc.with_thresholds((1, 4), {2: (1, 6)})


def test_numbers_in_range_load():
    dep = config_from_yaml(
        "models: [{name: qwen3-0.6b, kv_budget_gb: 20, mps_active_thread_percentage: 40},"
        " {name: qwen3-32b, mps_active_thread_percentage: 100}]\n"
        "placement: {mode: cross-host, link_latency_ms: 0, link_bandwidth_gbps: 25}\n"
        "policy: {kind: delayed, max_wait_ms: 0}\n"
    )
    assert dep.placement.link_bandwidth_gbps == 25 and dep.models[0].kv_budget_gb == 20


@pytest.mark.parametrize("kind", list(PolicyKind))
def test_policy_config_says_whether_it_is_sync_without_building(kind):
    pc = PolicyConfig(kind=kind)
    assert pc.is_sync == pc.build().is_sync == kind.is_sync
    assert pc.is_sync == (kind in (PolicyKind.STEP_SYNC, PolicyKind.MODEL_SYNC))


def test_a_models_overlap_setting_wins_over_the_scheduler_section():
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small", overlap=False), ModelConfig("tiny-large")],
                           scheduler=SchedulerConfig(overlap=True))  # fmt: skip
    assert [cfg.overlaps(0), cfg.overlaps(1)] == [False, True]
    off = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large", overlap=True)],
                           scheduler=SchedulerConfig(overlap=False))  # fmt: skip
    assert [off.overlaps(0), off.overlaps(1)] == [False, True]
