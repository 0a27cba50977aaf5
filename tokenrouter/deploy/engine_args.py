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


# Set from the deployment (model, KV pool, graph rule the scheduler shares, device): an override would break the
# agreement between the scheduler and its engine.
DEPLOYMENT_OWNED = frozenset({
    "model", "load_format", "device", "seed", "page_size", "num_pages", "kv_cache_bytes", "memory_budget_bytes",
    "gpu_memory_utilization", "max_context_len", "max_batch_size", "max_num_batched_tokens", "cuda_graphs",
    "graph_buckets", "graph_max_row_tokens", "graph_split", "shared_pages", "page_table_slots",
    "mps_active_thread_percentage",
})  # fmt: skip
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _typed(key: str, kind: str, text: str) -> Any:
    """`text` as the field's type (its annotation, a string under postponed evaluation)."""
    optional = kind.endswith("| None")
    base = kind.removesuffix("| None").strip()
    if optional and text.lower() == "none":
        return None
    try:
        if base == "bool":
            low = text.lower()
            if low not in _TRUE | _FALSE:
                raise ValueError
            return low in _TRUE
        if base in ("int", "float", "str"):
            return {"int": int, "float": float, "str": str}[base](text)
    except ValueError:
        alt = " (or none)" if optional else ""
        raise ValueError(f"engine option {key}: {text!r} is not of type {base}{alt}") from None
    raise ValueError(f"engine option {key} ({kind}) cannot be set from the command line")


def parse_engine_overrides(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings as `EngineConfig` keyword arguments, each typed by its field and the whole set checked
    by building a config (its own validation); ValueError names the first bad item. Keys the deployment sets
    (`DEPLOYMENT_OWNED`) are refused: change them in the deployment config instead."""
    import dataclasses
    import difflib

    from tokenrouter.engine.config import EngineConfig  # torch: only where an engine will run anyway

    kinds = {f.name: str(f.type) for f in dataclasses.fields(EngineConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ValueError(f"engine option {item!r}: expected KEY=VALUE, e.g. extend_split_keys=1024")
        if key not in kinds:
            near = difflib.get_close_matches(key, list(kinds), n=1)
            raise ValueError(f"unknown engine option {key!r}" + (f"; did you mean {near[0]}?" if near else ""))
        if key in DEPLOYMENT_OWNED:
            raise ValueError(f"engine option {key} is set by the deployment; change it in the config instead")
        out[key] = _typed(key, kinds[key], text.strip())
    if out:
        EngineConfig(model="tiny-small", device="cpu", **out)  # the config's own checks (ranges, choices)
    return out
