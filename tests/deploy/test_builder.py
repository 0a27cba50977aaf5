"""The deployment builder: one call gives a driver every part of a deployment, from the same config."""

from __future__ import annotations

import dataclasses

import pytest

from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig, PolicyConfig, SchedulerConfig
from tokenrouter.core.graph_rule import DEFAULT_GRAPH_BUCKETS, DEFAULT_GRAPH_MAX_ROW_TOKENS, GraphRule
from tokenrouter.core.messages import LiveCount
from tokenrouter.core.policy import PolicyKind
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.deploy import MEM_FRACTION, build_deployment, engine_kwargs, kv_capacity_tokens
from tokenrouter.models import load_spec


def config(**kw) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b", graph_max_row_tokens=32, overlap=False)], **kw
    )


def test_every_part_comes_from_the_config():
    cfg = config(policy=PolicyConfig("delayed", table={1: [1, 1], 8: [1, 3]}))
    d = build_deployment(cfg, gpu_memory_gb=141.0, seed=3)
    small, large = d.schedulers
    assert [s.model for s in d.schedulers] == [0, 1] and d.entry is small
    assert small.router is not large.router  # one router instance per subserver
    assert small.policy.kind is PolicyKind.DELAYED and d.gate is None
    assert d.graph_rules[0] == GraphRule() and d.graph_rules[1] == GraphRule(max_row_tokens=32)
    assert small.graph_rule is d.graph_rules[0]
    assert (small.overlap, large.overlap) == (True, False)  # per-model override of the scheduler default
    assert small.admission is not None and large.admission is None
    pages = [s.kv.num_pages - 1 for s in d.schedulers]
    assert [c.pages for c in small.admission.capacities] == pages  # the entry knows every pool
    assert [p * 16 for p in pages] == [c // 16 * 16 for c in d.kv_tokens]
    assert list(d.wakes(1)) == [1] and d.colocated(0) == [1]


def test_kv_capacity_is_the_joint_budget_under_mps_and_the_weights_leftover_apart():
    cfg = config()
    specs = [load_spec("qwen3-0.6b"), load_spec("qwen3-32b")]
    free = 141e9 * MEM_FRACTION - sum(s.weight_bytes for s in specs)
    joint = int(free // sum(s.kv_bytes_per_token for s in specs))
    assert kv_capacity_tokens(cfg, 141.0) == [joint, joint]
    apart = config(placement=PlacementConfig("separate"))
    apart.models[1].gpus = [1]
    caps = kv_capacity_tokens(apart, 141.0)
    assert caps == [int((141e9 * MEM_FRACTION - s.weight_bytes) // s.kv_bytes_per_token) for s in specs]
    budget = config()
    budget.models[1].kv_budget_gb = 1.0
    assert kv_capacity_tokens(budget, 141.0)[1] == int(1e9 // specs[1].kv_bytes_per_token)


def test_sync_policies_share_one_gate_and_std_serving_runs_eager_schedulers():
    d = build_deployment(config(policy=PolicyConfig("model-sync")), gpu_memory_gb=141.0)
    assert d.gate is not None and all(s.gate is d.gate for s in d.schedulers) and list(d.wakes(0)) == [0, 1]
    d = build_deployment(config(policy=PolicyConfig("eager"), baseline="std-serving"), gpu_memory_gb=141.0)
    assert d.std_serving and all(s.policy.kind is PolicyKind.EAGER for s in d.schedulers)


def test_admission_off_and_delivery_wiring():
    d = build_deployment(config(scheduler=SchedulerConfig(kv_admission=False)), gpu_memory_gb=141.0)
    assert d.entry.admission is None
    req = Request("a", [1, 2, 3], 3, SamplingParams(max_tokens=4), num_models=2)
    (send,) = d.entry.add(req, 0.0)
    assert isinstance(send.msg, LiveCount) and send.peer == 1
    assert d.deliver(send.msg, 0.0) == [] and d.schedulers[1].active == 1


def test_engine_settings_map_the_model_config_onto_the_engine_config():
    cfg = config()
    cfg.models[1].path = "/weights/qwen3-32b"
    d = build_deployment(cfg, gpu_memory_gb=141.0, seed=7)
    small, large = d.engine_args
    assert small["model"] == "qwen3-0.6b" and small["load_format"] == "dummy" and small["seed"] == 7
    assert large["model"] == "/weights/qwen3-32b" and large["load_format"] == "auto"
    assert (
        small["graph_buckets"] == DEFAULT_GRAPH_BUCKETS
        and small["graph_max_row_tokens"] == DEFAULT_GRAPH_MAX_ROW_TOKENS
    )
    assert large["graph_max_row_tokens"] == 32 and small["num_pages"] == d.schedulers[0].kv.num_pages
    assert engine_kwargs(cfg, 0, 10)["num_pages"] == 10
    # the engine is sized for the largest step the scheduler may form
    assert small["max_num_batched_tokens"] == cfg.scheduler.max_batch_tokens
    engine = pytest.importorskip("tokenrouter.engine.config")
    fields = {f.name for f in dataclasses.fields(engine.EngineConfig)}
    assert set(small) <= fields  # every key is an EngineConfig setting
    ec = engine.EngineConfig(**{**small, "device": "cpu"})
    assert ec.graph_max_row_tokens == DEFAULT_GRAPH_MAX_ROW_TOKENS and ec.graph_buckets == DEFAULT_GRAPH_BUCKETS
    assert small["graph_split"] is False and ec.graph_rule() == d.graph_rules[0]  # one pass per step by default
    cfg.models[0].graph_split = True  # the split stays an option, passed through to the engine
    assert engine.EngineConfig(**{**engine_kwargs(cfg, 0, 10), "device": "cpu"}).graph_rule().allow_split
