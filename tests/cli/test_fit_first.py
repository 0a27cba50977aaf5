"""A pair that does not fit the profile's GPU is named before the search for B, with its numbers (issue 32,
item 4): on an L4 (24 GB) it is qwen3-32b (65.5 GB of weights) that does not fit, not qwen3-0.6b."""

from __future__ import annotations

import pytest

import tokenrouter.sim.simulate as simulate_mod
from tokenrouter.calibration.gpus import GPU_SPECS
from tokenrouter.cli import trsim
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig
from tokenrouter.deploy.kv_budget import MEM_FRACTION, NoRoom, kv_capacity_tokens
from tokenrouter.models import load_spec


def test_the_model_that_does_not_fit_is_named_before_the_search(monkeypatch, capsys):
    def searched(*a, **k):
        raise AssertionError("the search for B ran before the fit was checked")

    monkeypatch.setattr(simulate_mod, "decide", searched)
    with pytest.raises(SystemExit) as e:
        trsim.main(["run", "--profile", "l4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    weights = load_spec("qwen3-32b").weight_bytes / 1e9
    usable = GPU_SPECS["l4"].memory_gb * MEM_FRACTION
    assert f"qwen3-32b does not fit: its weights take {weights:.1f} GB" in err, err
    assert f"{usable:.1f} GB an engine may use" in err and "--profile l4" in err, err
    assert "qwen3-0.6b" not in err


def test_two_models_that_fit_alone_but_not_together_are_both_named():
    dep = DeploymentConfig(models=[ModelConfig("qwen3-4b"), ModelConfig("qwen3-8b")], placement=PlacementConfig("mps"))
    with pytest.raises(NoRoom, match=r"^qwen3-4b and qwen3-8b leave no room for a KV cache on GPU 0"):
        kv_capacity_tokens(dep, 24.0)
    assert max(load_spec(m).weight_bytes / 1e9 for m in ("qwen3-4b", "qwen3-8b")) < 24.0 * MEM_FRACTION
    separate = DeploymentConfig(models=[ModelConfig("qwen3-4b"), ModelConfig("qwen3-8b", gpus=[1])],
                                placement=PlacementConfig("separate"))  # fmt: skip
    assert min(kv_capacity_tokens(separate, 24.0)) > 0
