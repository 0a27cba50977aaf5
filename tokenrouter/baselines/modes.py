"""Which deployment a baseline runs (no process, socket or torch imports: the CLI reads it before checking extras)."""

from __future__ import annotations

from dataclasses import replace

from tokenrouter.core.config import DeploymentConfig, PolicyConfig
from tokenrouter.core.names import Baseline
from tokenrouter.models import load_spec

BASELINES: tuple[str, ...] = tuple(b.value for b in Baseline)


def baseline_config(cfg: DeploymentConfig, mode: str) -> DeploymentConfig:
    """What `BaselineServer` runs for `mode` (one of `BASELINES`): `slm-only` the small model (the entry) alone,
    `llm-only` the other model with the most parameters alone, as plain continuous batching."""
    if mode == Baseline.STD_SERVING:
        return replace(cfg, baseline=Baseline.STD_SERVING, policy=PolicyConfig("eager"))
    if mode == "slm-only":
        k = cfg.small_model
    elif mode == "llm-only":
        others = [i for i in range(len(cfg.models)) if i != cfg.small_model]
        if not others:
            raise ValueError("llm-only needs a large model in the deployment")
        k = max(others, key=lambda i: load_spec(cfg.models[i].path or cfg.models[i].name).num_params)
    else:
        raise ValueError(f"not a single-model baseline: {mode!r}")
    return replace(cfg, models=[cfg.models[k]], entry=0, policy=PolicyConfig("eager"), baseline=None)
