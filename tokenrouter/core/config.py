"""Deployment config: what `trsim tune` writes and `tr serve --config` reads (YAML).

One schema for the simulator and the runtime, so a tuned configuration deploys unchanged. Validation
goes through msgspec (types) plus the checks below (meaning); every problem is a one-line ConfigError.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from tokenrouter.core.policy import POLICIES, Policy

PLACEMENTS = ("mps", "separate", "cross-host")
CONFIG_VERSION = 1


class ConfigError(ValueError):
    pass


@dataclass(slots=True)
class ModelConfig:
    name: str  # bundled spec name (qwen3-8b) or an HF directory
    path: str | None = None  # weights directory; None -> dummy weights
    gpus: list[int] = field(default_factory=lambda: [0])
    tp: int = 1
    kv_budget_gb: float | None = None  # None -> joint budget (same token capacity for every model)
    cuda_graphs: bool = True
    # Token buckets captured as CUDA graphs (the engine's default set); a step runs in a graph when its
    # token count fits the largest.
    graph_buckets: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256])
    # Rows up to this many tokens run inside the graphs (as one decode row per token); a peer return
    # after a geometric run with hop rate p carries ~1/p tokens, so 8 would send most of them eager.
    graph_max_row_tokens: int = 32
    host: str | None = None  # cross-host: where this subserver runs


@dataclass(slots=True)
class PlacementConfig:
    mode: str = "mps"
    link_latency_ms: float | None = None  # cross-host link; None -> the profile's
    link_bandwidth_gbps: float | None = None


@dataclass(slots=True)
class PolicyConfig:
    kind: str = "delayed"
    thresholds: list[int] = field(default_factory=list)
    table: dict[int, list[int]] = field(default_factory=dict)  # concurrency N -> thresholds
    max_wait_ms: float | None = None

    def build(self) -> Policy:
        return Policy(
            self.kind,
            thresholds=tuple(self.thresholds),
            table={int(n): tuple(b) for n, b in self.table.items()},
            max_wait=None if self.max_wait_ms is None else self.max_wait_ms / 1000.0,
        )


@dataclass(slots=True)
class RouterConfig:
    name: str = "r2r"
    hop_rate: float = 0.1
    return_prob: float = 1.0
    mean_small_run: float | None = None
    mean_large_run: float | None = None
    trace: str | None = None
    weights: str | None = None  # learned routers (later)


@dataclass(slots=True)
class SchedulerConfig:
    page_size: int = 16
    max_batch_size: int = 256
    max_batch_tokens: int = 16384
    overlap: bool = True  # async: prepare step k+1 while step k runs


@dataclass(slots=True)
class DeploymentConfig:
    models: list[ModelConfig]
    version: int = CONFIG_VERSION
    entry: int = 0
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    profile: str = "h200"
    notes: dict[str, Any] = field(default_factory=dict)  # provenance: tune inputs, predicted throughput

    def __post_init__(self) -> None:
        validate(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(_plain(asdict(self)), sort_keys=False, default_flow_style=None)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def validate(cfg: DeploymentConfig) -> None:
    m = len(cfg.models)
    if cfg.version != CONFIG_VERSION:
        raise ConfigError(f"config version {cfg.version} is not supported (expected {CONFIG_VERSION})")
    if m < 1:
        raise ConfigError("config needs at least one model")
    if not 0 <= cfg.entry < m:
        raise ConfigError(f"entry {cfg.entry} is not a model index (0..{m - 1})")
    if cfg.placement.mode not in PLACEMENTS:
        raise ConfigError(f"placement {cfg.placement.mode!r} unknown; choose one of {', '.join(PLACEMENTS)}")
    if cfg.policy.kind not in POLICIES:
        raise ConfigError(f"policy {cfg.policy.kind!r} unknown; choose one of {', '.join(POLICIES)}")
    for b in [cfg.policy.thresholds, *cfg.policy.table.values()]:
        if b and len(b) != m:
            raise ConfigError(f"thresholds {b} must have one value per model ({m})")
    for mc in cfg.models:
        if mc.tp < 1 or not mc.gpus or any(g < 0 for g in mc.gpus):
            raise ConfigError(f"model {mc.name}: tp must be >= 1 and gpus a non-empty list of indices")
        if any(b < 1 for b in mc.graph_buckets) or mc.graph_max_row_tokens < 1:
            raise ConfigError(f"model {mc.name}: graph buckets and graph_max_row_tokens must be >= 1")
    if cfg.scheduler.page_size < 1 or cfg.scheduler.max_batch_size < 1 or cfg.scheduler.max_batch_tokens < 1:
        raise ConfigError("scheduler page_size, max_batch_size and max_batch_tokens must be >= 1")
    try:
        cfg.policy.build()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def load_config(path: str | Path) -> DeploymentConfig:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    try:
        return msgspec.convert(raw, DeploymentConfig, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{p}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def joint_kv_tokens(free_bytes: float, kv_bytes_per_token: list[int]) -> int:
    """Token capacity T that every co-located model gets when they split `free_bytes` of KV memory.

    Giving each model the same capacity (rather than the same bytes) keeps a request that fits on one
    model from being preempted on its peer: T * sum(kv_bytes_per_token) = free_bytes.
    """
    return max(0, int(free_bytes // max(1, sum(kv_bytes_per_token))))


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
