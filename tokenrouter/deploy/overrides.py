"""One path from command-line flags to a deployment (docs/cli.md#deployment-flags): every CLI fills a
`DeploymentOverrides` with the flags given (None = not given) and calls `resolve_deployment`, so a flag beside
`--config` is never dropped; every deployment resolved passes `check_gpus`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from tokenrouter.core.config import (
    AutotuneConfig,
    ConfigError,
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    RouterConfig,
    check_prob,
    parse_config_name,
)
from tokenrouter.core.names import Baseline, Placement, RouterName
from tokenrouter.core.policy import PolicyKind
from tokenrouter.deploy.placement import check_gpus, default_gpus, gpus_from_first, sm_shares

DEFAULT_SMALL = "qwen3-0.6b"
DEFAULT_LARGE = "qwen3-32b"


class BChoice(StrEnum):
    """Where a simulated run's delayed-batching B comes from, a run setting beside the resolved deployment."""

    AUTO = "auto"  # the decider's B for the run's N: `--thresholds auto`, or a run without --config or --thresholds
    GIVEN = "given"  # `--thresholds`: checked against the run's N, the error naming the flag
    CONFIG = "config"  # the config's own thresholds or B(N) table


@dataclass(slots=True)
class DeploymentOverrides:
    """Deployment flags as given on a command line; None means "not given" (keep the config's value)."""

    small: str | None = None
    large: str | None = None
    models: list[str] | None = None
    placement: Placement | str | None = None
    gpus: list[int] | None = None
    tp: list[int] | None = None
    policy: PolicyKind | Baseline | str | None = None  # a policy kind, or std-serving (sets the baseline)
    thresholds: list[int] | None = None
    router: RouterName | str | None = None
    router_model: str | None = None
    hop_rate: float | None = None
    return_prob: float | None = None
    trace: str | None = None
    profile: str | None = None
    graphs: bool | None = None
    overlap: bool | None = None
    sm_percent: list[int] | None = None
    page_size: int | None = None
    max_batch_size: int | None = None
    max_batch_tokens: int | None = None
    max_model_len: int | None = None
    autotune: bool | None = None

    def given(self) -> dict[str, object]:
        """The flags that were given (for messages and provenance)."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


def default_deployment(names: list[str] | None = None) -> DeploymentConfig:
    """The deployment a CLI runs without `--config`: the default pair (or `names`), config defaults elsewhere."""
    names = names or [DEFAULT_SMALL, DEFAULT_LARGE]
    return DeploymentConfig(models=[ModelConfig(n) for n in names])


def resolve_deployment(base: DeploymentConfig | None, ov: DeploymentOverrides) -> DeploymentConfig:
    """`base` (or the default pair) with the given overrides applied; a bad value is a one-line ConfigError."""
    cfg = base if base is not None else default_deployment(_names(None, 0, ov))
    models = list(cfg.models)
    if base is not None:
        names = _names([m.name for m in models], cfg.entry, ov)
        if len(names) != len(models):  # --models with another count: fresh entries for the new list
            models = [ModelConfig(n) for n in names]
        else:
            models = [m if m.name == n else replace(m, name=n) for m, n in zip(models, names, strict=True)]
    place = cfg.placement
    if ov.placement is not None:
        place = replace(place, mode=parse_config_name(Placement, ov.placement, "placement"))
    if ov.tp is not None:
        models = [replace(m, tp=t) for m, t in zip(models, _tps(ov.tp, len(models)), strict=True)]
    gpus = _gpus(ov, models, place.mode, relayout=ov.placement is not None)
    if gpus is not None:
        models = [replace(m, gpus=g) for m, g in zip(models, gpus, strict=True)]
    if ov.graphs is not None:
        models = [replace(m, cuda_graphs=ov.graphs) for m in models]
    if ov.overlap is not None:
        models = [replace(m, overlap=None) for m in models]
    if ov.sm_percent is not None:
        shares = sm_shares(ov.sm_percent, len(models))
        models = [replace(m, mps_active_thread_percentage=p) for m, p in zip(models, shares, strict=True)]
    sched = cfg.scheduler
    for name in ("page_size", "max_batch_size", "max_batch_tokens", "max_model_len", "overlap"):
        v = getattr(ov, name)
        if v is not None:
            sched = replace(sched, **{name: v})
    out = dataclasses.replace(
        cfg,
        models=models,
        placement=place,
        **_policy(cfg, ov),
        router=_router(cfg.router, ov),
        scheduler=sched,
        profile=ov.profile if ov.profile is not None else cfg.profile,
    )
    check_gpus(out)
    return out


def _names(current: list[str] | None, entry: int, ov: DeploymentOverrides) -> list[str]:
    if ov.models is not None:
        if ov.small is not None or ov.large is not None:
            raise ConfigError("give either --models or --small/--large, not both")
        if len(ov.models) < 2:
            raise ConfigError(f"--models needs at least 2 models, got {len(ov.models)}")
        return list(ov.models)
    names = list(current) if current else [DEFAULT_SMALL, DEFAULT_LARGE]
    if ov.small is not None:
        names[entry] = ov.small
    if ov.large is not None:
        names[max(i for i in range(len(names)) if i != entry)] = ov.large
    return names


def _tps(tps: list[int], m: int) -> list[int]:
    if len(tps) not in (1, m) or any(t < 1 for t in tps):
        raise ConfigError(f"--tp: give one degree or one per model ({m}), each >= 1; got {tps}")
    return [tps[min(i, len(tps) - 1)] for i in range(m)]


def _gpus(
    ov: DeploymentOverrides, models: list[ModelConfig], mode: Placement, relayout: bool
) -> list[list[int]] | None:
    """New GPU lists, or None to keep the config's (see the module docstring)."""
    m, tps = len(models), [mc.tp for mc in models]
    if ov.gpus is not None:
        if len(ov.gpus) not in (1, m) or any(g < 0 for g in ov.gpus):
            raise ConfigError(f"--gpus: give one GPU id or one per model ({m}), each >= 0; got {ov.gpus}")
        return gpus_from_first([ov.gpus[min(i, len(ov.gpus) - 1)] for i in range(m)], tps)
    if relayout or (ov.tp is not None and any(len(mc.gpus) != mc.tp for mc in models)):
        return default_gpus(mode, tps)
    return None


def _policy(cfg: DeploymentConfig, ov: DeploymentOverrides) -> dict[str, Baseline | PolicyConfig | None]:
    """`baseline` and `policy` after `--autotune`, `--thresholds` and `--policy` (checked by the deployment)."""
    pc = cfg.policy
    if ov.autotune is not None:
        pc = replace(pc, autotune=(pc.autotune or AutotuneConfig()) if ov.autotune else None)
    if ov.thresholds is not None:
        pc = replace(pc.with_thresholds(ov.thresholds), kind=pc.kind)
    if ov.policy is None:
        return {"baseline": cfg.baseline, "policy": pc}
    if str(ov.policy).strip().lower() == Baseline.STD_SERVING:
        return {"baseline": Baseline.STD_SERVING, "policy": replace(pc, kind=PolicyKind.EAGER)}
    return {"baseline": None, "policy": replace(pc, kind=parse_config_name(PolicyKind, ov.policy, "policy"))}


def _router(rc: RouterConfig, ov: DeploymentOverrides) -> RouterConfig:
    if ov.router_model is not None:
        _check_router_model(ov.router_model)
    if ov.hop_rate is not None:
        check_prob(ov.hop_rate, "--hop-rate")
    if ov.return_prob is not None:
        check_prob(ov.return_prob, "--return-prob")
    name = parse_config_name(RouterName, ov.router, "router") if ov.router is not None else None
    given = {"name": name, "hop_rate": ov.hop_rate, "return_prob": ov.return_prob, "trace": ov.trace,
             "weights": ov.router_model}  # fmt: skip
    changes = {k: v for k, v in given.items() if v is not None}
    return replace(rc, **changes) if changes else rc


def _check_router_model(value: str) -> None:
    """A `--router-model` that is neither a file nor 'random' but reads like a typo of 'random' is named as one
    (a path that does not exist is otherwise for `tr serve`'s file check, which knows where it runs)."""
    if value.lower() == "random" or Path(value).exists():
        return
    if difflib.get_close_matches(value.lower(), ["random"], n=1, cutoff=0.6):
        raise ValueError(f"--router-model {value!r}: no such checkpoint file; did you mean 'random'?")
