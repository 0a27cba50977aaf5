"""GPU accounting: which GPUs each model occupies, which share one, how many a deployment uses, and the layouts
`trsim tune --placements` compares (`layout`); `check_gpus` holds the invariants of docs/config.md#placement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tokenrouter.core.config import ConfigError, DeploymentConfig
from tokenrouter.core.names import Layout, Placement
from tokenrouter.models import load_spec
from tokenrouter.models.tp_rules import tp_split_error


def default_gpus(mode: Placement | str, tps: Sequence[int]) -> list[list[int]]:
    """GPUs per model when only the placement and tp are known: under mps every model starts at GPU 0 (a model at
    tp = k spans GPUs 0..k-1); otherwise consecutive blocks, model i after model i-1."""
    if str(mode) == Placement.MPS:
        return [list(range(t)) for t in tps]
    out, nxt = [], 0
    for t in tps:
        out.append(list(range(nxt, nxt + t)))
        nxt += t
    return out


def gpus_from_first(first: Sequence[int], tps: Sequence[int]) -> list[list[int]]:
    """GPUs per model from its first GPU (`--gpus`): a model at tp = k takes k consecutive GPUs from it."""
    return [list(range(g, g + t)) for g, t in zip(first, tps, strict=True)]


def sm_shares(shares: Sequence[int], m: int) -> list[int | None]:
    """MPS SM shares for `m` models from one share or one per model (`mps_active_thread_percentage`: 0 or 100 is
    no cap, None). One-line ConfigError for another count or a share outside 0..100."""
    if len(shares) not in (1, m):
        raise ConfigError(f"--sm-percent: give one share or one per model ({m}), got {list(shares)}")
    if any(not 0 <= s <= 100 for s in shares):
        raise ConfigError(f"--sm-percent: each share must be in 0..100 (0 or 100 = no cap), got {list(shares)}")
    full = [shares[min(i, len(shares) - 1)] for i in range(m)]
    return [None if s in (0, 100) else s for s in full]


def with_shares(cfg: DeploymentConfig, shares: Sequence[int]) -> DeploymentConfig:
    """`cfg` with the MPS SM shares `shares` (`sm_shares`)."""
    new = sm_shares(shares, len(cfg.models))
    models = [dataclasses.replace(m, mps_active_thread_percentage=p) for m, p in zip(cfg.models, new, strict=True)]
    return dataclasses.replace(cfg, models=models)


def with_layout(cfg: DeploymentConfig, mode: Placement, tps: Sequence[int]) -> DeploymentConfig:
    """`cfg` placed by `mode` with tp per model, its GPUs following them (`default_gpus`), checked (`check_gpus`)."""
    gpus = default_gpus(mode, tps)
    models = [dataclasses.replace(m, tp=t, gpus=g) for m, t, g in zip(cfg.models, tps, gpus, strict=True)]
    out = dataclasses.replace(cfg, models=models, placement=dataclasses.replace(cfg.placement, mode=mode))
    check_gpus(out)
    return out


def check_gpus(cfg: DeploymentConfig, device: str = "cuda") -> None:
    """One-line ConfigError unless every model's `tp` splits its heads evenly and, on CUDA (on CPU `gpus` means
    nothing), every model has tp distinct GPUs (rank r on `gpus[r]`) and `separate` models share none."""
    for m in cfg.models:
        if m.tp < 1:
            raise ConfigError(f"model {m.name}: tp must be >= 1, got {m.tp}")
        if m.tp > 1:
            check_tp_divides(m.path or m.name, m.tp, m.name)
        if device != "cuda":
            continue
        if len(m.gpus) != m.tp:
            raise ConfigError(f"model {m.name}: tp={m.tp} needs {m.tp} GPU(s), but its gpus are {m.gpus} "
                              "(give --gpus the first GPU of each model, or leave --gpus out)")  # fmt: skip
        if len(set(m.gpus)) != len(m.gpus):
            raise ConfigError(f"model {m.name}: gpus {m.gpus} name a GPU twice")
    if cfg.placement.mode == Placement.SEPARATE and device == "cuda":
        owner: dict[int, str] = {}
        for m in cfg.models:
            for g in m.gpus:
                if g in owner:
                    raise ConfigError(f"placement separate: {owner[g]} and {m.name} both on GPU {g}; give each "
                                      "model its own GPUs (--gpus) or use --placement mps")  # fmt: skip
                owner[g] = m.name


def check_tp_divides(model: str, tp: int, name: str | None = None) -> None:
    """One-line ConfigError when `tp` does not divide the attention heads, KV heads and MLP width of `model` (`name`
    labels it). A shape that cannot be loaded is left to whoever loads it."""
    try:
        spec = load_spec(model)
    except (ValueError, OSError):
        return
    why = tp_split_error(spec, tp)
    if why is not None:
        raise ConfigError(f"model {name or model}: {why}")


def colocated(cfg: DeploymentConfig, model: int) -> list[int]:
    """Models that share a GPU with `model` under MPS (their passes slow each other down); none otherwise."""
    if cfg.placement.mode != Placement.MPS:
        return []
    mine = set(cfg.models[model].gpus)
    return [j for j, m in enumerate(cfg.models) if j != model and mine & set(m.gpus)]


def gpus_used(cfg: DeploymentConfig) -> int:
    """GPUs the deployment occupies: the distinct ids over all models (cross-host: per host, added up)."""
    if cfg.placement.mode == Placement.CROSS_HOST:
        return sum(len(set(m.gpus)) for m in cfg.models)
    return len({g for m in cfg.models for g in m.gpus})


def layout(choice: Layout | str, num_gpus: int, cfg: DeploymentConfig) -> tuple[Placement, list[int]]:
    """The placement mode and tp per model of a small/large `choice` on `num_gpus` GPUs (GPUs then follow
    `default_gpus`). ValueError (one line) when the layout does not fit or the large model cannot split."""
    choice = Layout(str(choice))
    if len(cfg.models) != 2:
        raise ValueError(f"layouts are for a small/large pair; this deployment has {len(cfg.models)} models")
    need = {Layout.MPS: 1, Layout.SEPARATE: 2, Layout.TP: 2}[choice]
    if num_gpus < need:
        raise ValueError(f"layout {choice} needs at least {need} GPUs; --num-gpus is {num_gpus}")
    large = 1 - cfg.entry
    tps = [1, 1]
    if choice is Layout.TP:
        m = cfg.models[large]
        try:
            check_tp_divides(m.path or m.name, num_gpus, m.name)
        except ConfigError as e:
            raise ValueError(f"layout tp: {e}") from None
        tps[large] = num_gpus
    mode = Placement.SEPARATE if choice is Layout.SEPARATE else Placement.MPS
    return mode, tps
