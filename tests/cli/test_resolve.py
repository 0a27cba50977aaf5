"""One path from flags to a deployment: every CLI that builds a deployment (`trsim run | sweep | tune`,
`tr serve`, `tr bench --sim`) resolves the same config and the same flags to an equal `DeploymentConfig`, and a
flag given beside `--config` is applied, never dropped.

The reference for what each flag must do is written here by hand from the config the test saves (the
`expect_*` edits below), not taken from the resolver under test."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from cli_call import call

from tokenrouter.cli import tr, trsim
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig, PolicyConfig, RouterConfig
from tokenrouter.deploy import DeploymentOverrides, resolve_deployment


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    cfg = DeploymentConfig(
        models=[ModelConfig("tiny-small"), ModelConfig("tiny-large", overlap=True)],
        placement=PlacementConfig("mps"),
        policy=PolicyConfig(kind="delayed", thresholds=[1, 3], table={1: [1, 1], 8: [1, 6]}),
        router=RouterConfig("r2r", hop_rate=0.1),
    )
    path = tmp_path / "serve.yaml"
    cfg.save(path)
    return path


# (flags, edit of the saved config's plain dict that the flags must make)
def _policy_step_sync(d):
    d["policy"]["kind"] = "step-sync"


def _thresholds(d):
    d["policy"].update(thresholds=[2, 5], table={})


def _no_overlap(d):
    d["scheduler"]["overlap"] = False
    for m in d["models"]:
        m["overlap"] = None


def _hop(d):
    d["router"]["hop_rate"] = 0.2


def _separate(d):
    d["placement"]["mode"] = "separate"
    for i, m in enumerate(d["models"]):
        m["gpus"] = [i]


def _tp_mps(d):
    # the config is mps: the large model at tp=2 spans GPUs 0 and 1, the small one stays on GPU 0 beside it
    d["models"][1].update(tp=2, gpus=[0, 1])


def _tp_separate(d):
    d["placement"]["mode"] = "separate"
    d["models"][0]["gpus"] = [0]
    d["models"][1].update(tp=2, gpus=[1, 2])


def _tp_first_gpus(d):
    d["placement"]["mode"] = "separate"
    d["models"][0]["gpus"] = [3]
    d["models"][1].update(tp=2, gpus=[0, 1])


def _shares(d):
    d["models"][0]["mps_active_thread_percentage"] = 40
    d["models"][1]["mps_active_thread_percentage"] = 60


def _graphs_off(d):
    for m in d["models"]:
        m["cuda_graphs"] = False


def _router(d):
    d["router"].update(name="r-stitch", return_prob=0.5)


def _profile(d):
    d["profile"] = "other.json"


CASES = [
    (["--policy", "step-sync"], [_policy_step_sync]),
    (["--thresholds", "2,5"], [_thresholds]),
    (["--no-overlap"], [_no_overlap]),
    (["--hop-rate", "0.2"], [_hop]),
    (["--placement", "separate"], [_separate]),
    (["--tp", "1,2"], [_tp_mps]),
    (["--tp", "1,2", "--placement", "separate"], [_tp_separate]),
    (["--tp", "1,2", "--placement", "separate", "--gpus", "3,0"], [_tp_first_gpus]),
    (["--sm-percent", "40,60"], [_shares]),
    (["--no-graphs"], [_graphs_off]),
    (["--router", "r-stitch", "--return-prob", "0.5"], [_router]),
    (["--profile", "other.json"], [_profile]),
    (["--policy", "step-sync", "--thresholds", "2,5", "--no-overlap", "--hop-rate", "0.2"],
     [_policy_step_sync, _thresholds, _no_overlap, _hop]),
]  # fmt: skip


def _dry_runs(config: Path, flags: list[str], capsys) -> dict[str, dict]:
    """The deployment each CLI prints with --dry-run for the same config and flags."""
    base = ["--config", str(config), *flags, "--dry-run"]
    out: dict[str, dict] = {}
    for name, main, argv in (
        ("trsim run", trsim.main, ["run", *base]),
        ("trsim sweep", trsim.main, ["sweep", *base]),
        ("tr serve", tr.main, ["serve", "--device", "cuda", *base]),
        ("tr bench --sim", tr.main, ["bench", "--url", "http://127.0.0.1:9", "--sim", *base]),
        ("trsim tune", trsim.main, ["tune", *base]),
    ):
        rc, text, err = call(main, argv, capsys)
        assert rc == 0, (name, err)
        out[name] = yaml.safe_load(text)
    return out


@pytest.mark.parametrize(("flags", "edits"), CASES)
def test_every_cli_applies_the_flags_beside_a_config(config_file, flags, edits, capsys):
    expect = yaml.safe_load(config_file.read_text())
    for edit in edits:
        edit(expect)
    got = _dry_runs(config_file, flags, capsys)
    tune = got.pop("trsim tune")
    for name, dep in got.items():
        assert dep == expect, name
    # tune tunes thresholds under delayed: everything else is what the others resolve.
    tuned = copy.deepcopy(expect)
    tuned["policy"].update(kind="delayed", thresholds=expect["policy"]["thresholds"], table=expect["policy"]["table"])
    assert {k: v for k, v in tune.items() if k != "policy"} == {k: v for k, v in tuned.items() if k != "policy"}


def test_run_with_config_simulates_the_flag_policy(config_file, tmp_path, capsys):
    """The issue's case: `trsim run --config C --policy step-sync` simulated delayed before (flags dropped)."""
    fast = ["--config", str(config_file), "--workload", "fixed:8,24", "--num-requests", "8", "-n", "4",
            "--small", "qwen3-0.6b", "--large", "qwen3-32b"]  # fmt: skip
    results = {}
    for policy in ("delayed", "step-sync"):
        rc, text, err = call(trsim.main, ["run", *fast, "--policy", policy, "--json", "-"], capsys)
        assert rc == 0, err
        results[policy] = json.loads(text)
    assert results["step-sync"]["policy"] == "step-sync" and results["delayed"]["policy"] == "delayed"
    # step-sync holds every model to one global round: slower than delayed batching on the same cell.
    assert results["step-sync"]["output_throughput_tok_s"] < results["delayed"]["output_throughput_tok_s"]


def test_small_and_large_rename_entry_and_last():
    base = DeploymentConfig(models=[ModelConfig("a"), ModelConfig("b"), ModelConfig("c")], entry=1)
    got = resolve_deployment(base, DeploymentOverrides(small="s", large="l"))
    assert [m.name for m in got.models] == ["a", "s", "l"]
    got = resolve_deployment(None, DeploymentOverrides(models=["x", "y", "z"]))
    assert [m.name for m in got.models] == ["x", "y", "z"] and got.entry == 0


def test_policy_std_serving_is_an_alias_that_sets_the_baseline():
    base = resolve_deployment(None, DeploymentOverrides(thresholds=[1, 3]))
    std = resolve_deployment(base, DeploymentOverrides(policy="std-serving"))
    assert std.baseline == "std-serving" and std.policy.kind == "eager" and std.policy.thresholds == [1, 3]
    assert std.policy_label == "std-serving"
    routed = resolve_deployment(std, DeploymentOverrides(policy="delayed"))
    assert routed.baseline is None and routed.policy == base.policy
    kept = resolve_deployment(std, DeploymentOverrides(thresholds=[1, 5]))
    assert kept.baseline == "std-serving" and kept.policy.kind == "eager" and kept.policy.thresholds == [1, 5]


@pytest.mark.parametrize(
    ("ov", "needle"),
    [
        (DeploymentOverrides(thresholds=[1, 2, 3]), "one value per model"),
        (DeploymentOverrides(gpus=[0, 1, 2]), "--gpus"),
        (DeploymentOverrides(sm_percent=[120]), "--sm-percent"),
        (DeploymentOverrides(policy="fastest"), "fastest"),
        (DeploymentOverrides(placement="moon"), "moon"),
        (DeploymentOverrides(router="oracle"), "oracle"),
        (DeploymentOverrides(hop_rate=1.5), "--hop-rate"),
        (DeploymentOverrides(models=["a", "b"], small="c"), "either --models"),
        (DeploymentOverrides(tp=[0, 1]), "--tp"),
        (DeploymentOverrides(tp=[1, 2, 2]), "--tp"),
        (DeploymentOverrides(placement="separate", gpus=[0]), "both on GPU 0"),
        (DeploymentOverrides(placement="separate", tp=[2, 1], gpus=[0, 1]), "both on GPU 1"),
    ],
)
def test_bad_overrides_are_one_line_errors(ov, needle):
    with pytest.raises(ValueError, match=needle) as e:
        resolve_deployment(None, ov)
    assert "\n" not in str(e.value)


def test_hop_prob_is_accepted_with_a_deprecation_note(capsys):
    argv = ["model", "--step-ms", "6,27.9", "--concurrency", "4", "--thresholds", "1,3"]
    rc_new, out_new, _ = call(trsim.main, [*argv, "--hop-rate", "0.35"], capsys)
    rc_old, out_old, err_old = call(trsim.main, [*argv, "--hop-prob", "0.35"], capsys)
    assert rc_new == rc_old == 0
    assert out_new.splitlines()[-1] == out_old.splitlines()[-1]
    assert "deprecated" in err_old and "--hop-rate" in err_old


def test_a_config_whose_gpus_do_not_match_its_tp_is_refused(tmp_path, capsys):
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large", tp=2, gpus=[1])],
                           placement=PlacementConfig("separate"))  # fmt: skip
    path = tmp_path / "bad.yaml"
    cfg.save(path)
    rc, _, err = call(trsim.main, ["run", "--config", str(path), "--dry-run"], capsys)
    assert rc == 2 and "tp=2 needs 2 GPU(s)" in err and len(err.strip().splitlines()) == 1
    # --tp 1 fixes it: the GPUs follow the placement again
    rc, text, err = call(trsim.main, ["run", "--config", str(path), "--tp", "1", "--dry-run"], capsys)
    assert rc == 0, err
    assert [(m["tp"], m["gpus"]) for m in yaml.safe_load(text)["models"]] == [(1, [0]), (1, [1])]


def test_tp_is_a_sweep_axis(capsys):
    rc, text, err = call(trsim.main, ["sweep", "--tp", "1,1;1,2", "--dry-run"], capsys)
    assert rc == 0, err
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [[(m["tp"], m["gpus"]) for m in d["models"]] for d in docs] == [
        [(1, [0]), (1, [0])],
        [(1, [0]), (2, [0, 1])],
    ]
