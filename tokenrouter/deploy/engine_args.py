"""A model's engine settings, derived from the deployment config, as keyword arguments for the engine's
`EngineConfig` (a plain dict, so building a deployment needs no torch)."""

from __future__ import annotations

from typing import Any

from tokenrouter.core.config import DeploymentConfig


def engine_kwargs(dep: DeploymentConfig, model: int, num_pages: int, seed: int = 0) -> dict[str, Any]:
    """`EngineConfig(**engine_kwargs(...))` for model `model`; `num_pages` is its KV pool (null page included),
    the same pool the scheduler allocates from. The graph settings are the model's `GraphRule`."""
    mc = dep.models[model]
    rule = mc.graph_rule()
    kw = {
        "model": mc.path or mc.name,
        "load_format": "auto" if mc.path else "dummy",
        "device": f"cuda:{mc.gpus[0]}",
        "seed": seed,
        "page_size": dep.scheduler.page_size,
        "num_pages": num_pages,
        "max_batch_size": dep.scheduler.max_batch_size,
        # the engine sizes activations and varlen graphs for the largest step the scheduler may form
        "max_num_batched_tokens": dep.scheduler.max_batch_tokens,
        "cuda_graphs": rule.enabled,
        "graph_buckets": rule.buckets,
        "graph_max_row_tokens": rule.max_row_tokens,
        "graph_split": rule.allow_split,
    }
    if dep.scheduler.max_model_len is not None:  # narrower page tables (and graphs) for a shorter context
        kw["max_context_len"] = dep.scheduler.max_model_len
    return kw
