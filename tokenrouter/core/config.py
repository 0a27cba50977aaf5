"""Deployment config: what `trsim tune` writes and `tr serve --config` reads (YAML; every field: docs/config.md). One
schema for the simulator and the runtime; msgspec checks types, `validate` meaning; every problem is a ConfigError.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec
import yaml

from tokenrouter.core.graph_rule import DEFAULT_GRAPH_BUCKETS, DEFAULT_GRAPH_MAX_ROW_TOKENS, GraphRule
from tokenrouter.core.hop_law import MARKOV_ROUTERS, check_prob
from tokenrouter.core.names import Baseline, E, Placement, RouterName, parse_name
from tokenrouter.core.policy import Policy, PolicyKind, check_policy

PLACEMENTS: tuple[str, ...] = tuple(p.value for p in Placement)
CONFIG_VERSION = 2


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
    # The three graph fields are the core's GraphRule (`graph_rule`).
    graph_buckets: list[int] = field(default_factory=lambda: list(DEFAULT_GRAPH_BUCKETS))
    graph_max_row_tokens: int = DEFAULT_GRAPH_MAX_ROW_TOKENS
    graph_split: bool = False
    host: str | None = None  # where this subserver runs; set: tcp peers (`placement.transport`)
    external: bool = False  # started by hand (`tokenrouter subserver --join`); the launcher waits for it
    overlap: bool | None = None  # None: the scheduler section's `overlap`
    mps_active_thread_percentage: int | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; None: all SMs
    profile: str | None = None  # the simulator's prices for this model's GPU; None: the deployment's `profile`

    def graph_rule(self) -> GraphRule:
        return GraphRule(self.cuda_graphs, tuple(self.graph_buckets), self.graph_max_row_tokens, self.graph_split)


@dataclass(slots=True)
class PlacementConfig:
    """`transport` (`ipc`, `tcp`; null: tcp when a model has a `host` or is `external`), `port_base` (null: free
    ports published to the peers; `runtime.addresses`) and `launcher_host`: docs/config.md."""

    mode: Placement = Placement.MPS
    link_latency_ms: float | None = None  # cross-host link; None -> the profile's
    link_bandwidth_gbps: float | None = None
    transport: str | None = None
    port_base: int | None = None
    launcher_host: str | None = None

    def __post_init__(self) -> None:
        self.mode = parse_config_name(Placement, self.mode, "placement")
        if self.transport not in (None, "ipc", "tcp"):
            raise ConfigError(f"placement.transport must be ipc, tcp or null, got {self.transport!r}")
        if self.port_base is not None and not 1 <= self.port_base <= 65_000:
            raise ConfigError(f"placement.port_base must be a port in 1..65000, got {self.port_base}")


@dataclass(slots=True)
class AutotuneConfig:
    """`policy.autotune`: re-solve B while serving (`core.autotune`; every field: docs/autotune.md). Rates and
    thresholds are relative, times in seconds."""

    observe_s: float = 1.0
    interval_s: float = 5.0
    tolerance: float = 0.1
    min_gain: float = 0.02
    hold_s: float = 10.0
    half_life_s: float = 4.0
    step_half_life_s: float = 60.0
    min_steps: int = 50
    max_states: int = 50_000
    verify_s: float = 10.0
    verify_margin: float = 0.02
    search_s: float = 4.0
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        positive = ("observe_s", "interval_s", "half_life_s", "step_half_life_s", "search_s")
        for name in (*positive, "tolerance", "min_gain", "hold_s", "verify_s", "verify_margin"):
            v, strict = getattr(self, name), name in positive
            if not (isinstance(v, int | float) and math.isfinite(v) and (v > 0 if strict else v >= 0)):
                raise ConfigError(f"policy.autotune.{name} must be a number {'>' if strict else '>='} 0, got {v!r}")
        for name, lo in (("min_steps", 1), ("max_states", 100)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"policy.autotune.{name} must be an integer >= {lo}, got {v!r}")
        v = self.slo_tpot_ms
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"policy.autotune.slo_tpot_ms must be a number of ms > 0 or null, got {v!r}")


@dataclass(slots=True, frozen=True)
class PolicyConfig:
    """The batching policy, the one carrier of B above the core (docs/core.md); `build()` gives the core's `Policy`.
    Checked when made (`check`), never changed: `with_thresholds` and `dataclasses.replace` give a new one."""

    kind: PolicyKind = PolicyKind.DELAYED
    thresholds: list[int] = field(default_factory=list)
    table: dict[int, list[int]] = field(default_factory=dict)  # concurrency N -> thresholds
    max_wait_ms: float | None = None
    autotune: AutotuneConfig | None = None  # re-tune B while serving (None: B stays as configured)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_config_name(PolicyKind, self.kind, "policy"))  # a str from YAML
        self.check()

    def check(self, num_models: int | None = None, concurrency: int | None = None) -> None:
        """`core.policy.check_policy`, the one check of a policy that every entry runs, as a ConfigError."""
        try:
            check_policy(self.thresholds, self.table, self.max_wait_ms, num_models, concurrency)
        except ValueError as e:
            raise ConfigError(f"policy: {e}") from None

    def with_thresholds(self, b: Sequence[int], table: Mapping[int, Sequence[int]] | None = None) -> PolicyConfig:
        """This policy, delayed at a tuned B: flat `b` and `table` (none: the old table goes, its rows would win
        over the new B); max_wait and autotune kept. The one way a tuned B becomes a policy (`build()`: the core's)."""
        rows = {int(n): [int(x) for x in row] for n, row in (table or {}).items()}
        return replace(self, kind=PolicyKind.DELAYED, thresholds=[int(x) for x in b], table=rows)

    @property
    def is_sync(self) -> bool:
        """Step-sync or model-sync (the core's `PolicyKind.is_sync`)."""
        return self.kind.is_sync

    def build(self) -> Policy:
        """The core policy."""
        max_wait = None if self.max_wait_ms is None else self.max_wait_ms / 1000.0
        table = {int(n): tuple(b) for n, b in self.table.items()}
        return Policy(self.kind, thresholds=tuple(self.thresholds), table=table, max_wait=max_wait)


@dataclass(slots=True)
class RouterConfig:
    name: RouterName = RouterName.R2R
    hop_rate: float = 0.1
    return_prob: float = 1.0
    mean_small_run: float | None = None
    mean_large_run: float | None = None
    trace: str | None = None
    weights: str | None = None  # learned router weights: a checkpoint file, or "random" (calibrated)

    def __post_init__(self) -> None:
        self.name = parse_config_name(RouterName, self.name, "router")


@dataclass(slots=True)
class SchedulerConfig:
    page_size: int = 16
    max_batch_size: int = 256
    max_batch_tokens: int = 16384
    # CPU-GPU overlap (not the paper's "async", which is asynchrony between subservers: the policy's business).
    overlap: bool = True
    kv_admission: bool = True  # core.admission; off: admit all, preempt
    kv_growth_tokens: int | None = 256  # reserved headroom per live request; null: its worst case
    max_model_len: int | None = None  # as vLLM's --max-model-len; null: the models' own limit


@dataclass(slots=True)
class DeploymentConfig:
    models: list[ModelConfig]
    version: int = CONFIG_VERSION
    entry: int = 0
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    baseline: Baseline | None = None  # std-serving: a server per model, a returning hop is a new request
    router: RouterConfig = field(default_factory=RouterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    profile: str = "h200"
    notes: dict[str, Any] = field(default_factory=dict)  # provenance: tune inputs, predicted throughput

    def __post_init__(self) -> None:
        validate(self)

    @property
    def policy_label(self) -> str:
        """How reports name the way this deployment batches: its baseline when set, else its policy kind."""
        return str(self.baseline or self.policy.kind)

    @property
    def small_model(self) -> int:
        """Index of the small model: the entry (every other model is a large one). Learned routers read its
        outputs, so the deployment derives that role from here, never from an index."""
        return self.entry

    def is_small(self, model_index: int) -> bool:
        return model_index == self.small_model

    def overlaps(self, model_index: int) -> bool:
        """Whether model `model_index` overlaps CPU and GPU: its own `overlap`, else the scheduler section's. The
        one reading of the two settings."""
        own = self.models[model_index].overlap
        return self.scheduler.overlap if own is None else own

    @property
    def transport(self) -> str:
        """`ipc` or `tcp` (`PlacementConfig.transport`, null resolved)."""
        if self.placement.transport is not None:
            return self.placement.transport
        return "tcp" if any(m.host or m.external for m in self.models) else "ipc"

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
    rc = cfg.router
    for what, x in (("router hop_rate", rc.hop_rate), ("router return_prob", rc.return_prob)):
        check_prob(x, what, ConfigError)
    if cfg.baseline is not None and (cfg.baseline != Baseline.STD_SERVING or cfg.policy.kind != PolicyKind.EAGER):
        raise ConfigError(
            f"a deployment's baseline is std-serving, with policy kind eager (it batches continuously; "
            f"the others are `tr serve --baseline` modes); got {cfg.baseline}, {cfg.policy.kind}"
        )
    cfg.policy.check(m)
    for mc in cfg.models:
        if mc.tp < 1 or not mc.gpus or any(g < 0 for g in mc.gpus):
            raise ConfigError(f"model {mc.name}: tp must be >= 1 and gpus a non-empty list of indices")
        if mc.kv_budget_gb is not None and not (math.isfinite(mc.kv_budget_gb) and mc.kv_budget_gb > 0):
            raise ConfigError(f"model {mc.name}: kv_budget_gb must be a number > 0 (GB) or null, got {mc.kv_budget_gb}")
        if mc.profile is not None and not mc.profile.strip():
            raise ConfigError(f"model {mc.name}: profile must name a GPU kind or a profile file, or be null")
        share = mc.mps_active_thread_percentage
        if share is not None and not 1 <= share <= 100:
            raise ConfigError(f"model {mc.name}: mps_active_thread_percentage must be in 1..100 or null (no cap), "
                              f"got {share}")  # fmt: skip
        try:
            mc.graph_rule()
        except ValueError as e:
            raise ConfigError(f"model {mc.name}: {e}") from None
    if cfg.placement.transport == "ipc" and any(mc.host or mc.external for mc in cfg.models):
        raise ConfigError("placement.transport ipc keeps every process on one host: a model with a host or "
                          "external: true needs tcp (or null)")  # fmt: skip
    for what, v, lo_ok in (("link_latency_ms", cfg.placement.link_latency_ms, True),
                           ("link_bandwidth_gbps", cfg.placement.link_bandwidth_gbps, False)):  # fmt: skip
        if v is not None and not (math.isfinite(v) and (v > 0 or (lo_ok and v == 0))):
            raise ConfigError(f"placement.{what} must be a number {'>=' if lo_ok else '>'} 0 or null, got {v}")
    if cfg.placement.port_base is not None and cfg.placement.port_base + 4 + m > 65_535:
        raise ConfigError(f"placement.port_base {cfg.placement.port_base} leaves no room for {m} models' ports")
    if cfg.scheduler.page_size < 1 or cfg.scheduler.max_batch_size < 1 or cfg.scheduler.max_batch_tokens < 1:
        raise ConfigError("scheduler page_size, max_batch_size and max_batch_tokens must be >= 1")
    if cfg.scheduler.kv_growth_tokens is not None and cfg.scheduler.kv_growth_tokens < 1:
        raise ConfigError("scheduler kv_growth_tokens must be >= 1 or null")
    if cfg.scheduler.max_model_len is not None and cfg.scheduler.max_model_len < 2:
        raise ConfigError("scheduler max_model_len must be >= 2 (a prompt token and an output token) or null")
    if cfg.policy.autotune is not None:
        if cfg.policy.is_sync or cfg.baseline is not None:
            raise ConfigError(f"policy.autotune tunes delayed-batching thresholds: it needs policy delayed or eager, "
                              f"not {cfg.policy_label}")  # fmt: skip
        if rc.name not in MARKOV_ROUTERS or (rc.name != RouterName.ME and m != 2):
            raise ConfigError(
                f"policy.autotune needs a router the Markov model describes (r2r, citer, co-llm, "
                f"r-stitch, markov over two models; me over more), not {rc.name} over {m} models"
            )


def load_config(path: str | Path) -> DeploymentConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    try:
        return config_from_yaml(text)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def config_from_yaml(text: str) -> DeploymentConfig:
    """A deployment from YAML text (what `to_yaml` writes); ConfigError for anything wrong."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError("expected a mapping at the top level")
    raw = migrate(raw)
    check_keys(raw, DeploymentConfig, "$")
    try:
        return msgspec.convert(raw, DeploymentConfig, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(str(e)) from None


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A saved deployment's mapping in the current schema, meaning the same. Version 1 (or no `version`) differs in
    one place: its `policy.kind: std-serving` is `baseline: std-serving` with an eager policy."""
    version, policy = raw.get("version", 1), raw.get("policy")
    if version not in (1, CONFIG_VERSION):
        raise ConfigError(f"config version {version!r} is not supported (this tokenrouter reads 1 to {CONFIG_VERSION})")
    if version == 1 and isinstance(policy, dict) and str(policy.get("kind")).lower() == Baseline.STD_SERVING:
        raw = {**raw, "policy": {**policy, "kind": PolicyKind.EAGER.value}, "baseline": Baseline.STD_SERVING.value}
    return {**raw, "version": CONFIG_VERSION}


def check_keys(raw: Any, cls: type, where: str) -> None:
    """Refuse a key the schema lacks, at any depth (msgspec ignores them, so a typo would load as the default it
    meant to replace); `where` is the path in msgspec's notation (`$.policy`). Wrong shapes are msgspec's."""
    if not isinstance(raw, dict):
        return
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(names)}"
            raise ConfigError(f"unknown key `{key}` at `{where}`{hint}")
        inner = _dataclass_in(hints[key])
        if inner is None:
            continue
        value = raw[key]
        if isinstance(value, list) and typing.get_origin(hints[key]) is list:
            for i, item in enumerate(value):
                check_keys(item, inner, f"{where}.{key}[{i}]")
        else:
            check_keys(value, inner, f"{where}.{key}")


def _dataclass_in(tp: Any) -> type | None:
    """The config dataclass a field holds: itself, in `X | None`, or as the items of `list[X]`; else None."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    if typing.get_origin(tp) in (list, types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg  # type: ignore[return-value]
    return None


def parse_config_name(enum: type[E], value: str | E, what: str) -> E:
    """`names.parse_name` whose error is a ConfigError (every config and flag value goes through it)."""
    try:
        return parse_name(enum, value, what)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _plain(x: Any) -> Any:
    if isinstance(x, StrEnum):
        return x.value
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
