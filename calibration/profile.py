"""Profile schema (version 2): what the cost model knows about one GPU and the models run on it (docs/calibration.md).
Kinds: "measured", "analytic", "estimated". Units: ms, bytes, GB/s = 1e9 B/s, TFLOP/s, GB = 1e9 B, and Gbit/s for
the cross-host link. A violation is a one-line `ProfileError` naming the file.
"""

from __future__ import annotations

from datetime import date, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .measured import CoRunGrid, HostCosts, MeasuredPasses, NonNeg, ProfileStruct, RouterCost, RuntimeInfo

SCHEMA_VERSION = 2
DEFAULT_PROFILE = "h200"

Positive = Annotated[float, msgspec.Meta(gt=0.0)]
Slowdown = Annotated[float, msgspec.Meta(ge=1.0)]


class ProfileError(ValueError):
    """A profile that cannot be used. The message is one line: `<file>: <problem>`."""


class StepCoeffs(ProfileStruct):
    """step_ms = max(c0 + c_row*B + c_ctx*C + c_tok*T + c_ext*E, floor_ms) (docs/calibration.md, The cost model);
    floor_ms: the host's issue rate for eager kernels (0 when unused)."""

    c0: NonNeg
    c_row: NonNeg = 0.0
    c_ctx: NonNeg = 0.0
    c_tok: NonNeg = 0.0
    c_ext: NonNeg = 0.0
    floor_ms: NonNeg = 0.0

    def at(self, batch_size: int, num_tokens: int, extend_tokens: int, context_tokens: int) -> float:
        """Step time in ms (reference implementation; the cost model inlines the same formula)."""
        t = self.c0 + self.c_row * batch_size + self.c_ctx * context_tokens + self.c_tok * num_tokens
        return max(t + self.c_ext * extend_tokens, self.floor_ms)


class StepModes(ProfileStruct):
    """Coefficients with CUDA graphs (`graph`) and without (`eager`)."""

    graph: StepCoeffs
    eager: StepCoeffs


class ModelProfile(ProfileStruct, kw_only=True):
    """One model on this GPU at this `tp` degree (other degrees: keys `NAME@tpK`). `weight_bytes`: every TP shard
    together; `kv_bytes_per_token`: K and V over all layers. `router_ms` / `kv_budget_gb` override the profile-wide
    defaults when not null. Measured profiles add `passes` (replace `step`), `host` and `routers`."""

    weight_bytes: Annotated[int, msgspec.Meta(ge=0)]
    kv_bytes_per_token: Annotated[int, msgspec.Meta(gt=0)]
    tp: Annotated[int, msgspec.Meta(ge=1)] = 1
    step: StepModes
    router_ms: NonNeg | None = None
    kv_budget_gb: NonNeg | None = None
    passes: MeasuredPasses | None = None
    host: HostCosts | None = None
    routers: dict[str, RouterCost] = msgspec.field(default_factory=dict)


class GpuInfo(ProfileStruct):
    """mem_bw_gbs: measured device copy bandwidth (GB/s); matmul_tflops: measured dense bf16 GEMM."""

    name: str
    mem_bw_gbs: Positive
    matmul_tflops: Positive
    memory_gb: Positive


class LinkInfo(ProfileStruct):
    """Cross-host peer link: one message costs latency_ms + bytes / (bandwidth_gbps * 1e9 / 8 B/s)."""

    latency_ms: NonNeg
    bandwidth_gbps: Positive


class AllReduceInfo(ProfileStruct):
    """Tensor parallelism: one all-reduce of n bytes over `tp` ranks costs latency_ms + n * 2(tp-1)/tp /
    (bus_bandwidth_gbs * 1e9 B/s) (NCCL's bus-bandwidth convention), measured at `measured_tp` ranks."""

    latency_ms: NonNeg
    bus_bandwidth_gbs: Positive
    measured_tp: Annotated[int, msgspec.Meta(ge=2)] = 2


class MpsInfo(ProfileStruct):
    """Co-location under CUDA MPS: `pairs["a|b"]` is the slowdown factor of model a's step while b runs."""

    default_slowdown: Slowdown
    pairs: dict[str, Slowdown] = msgspec.field(default_factory=dict)


class StdServingInfo(ProfileStruct):
    """Standard-serving bookkeeping per re-matched row: hop_overhead_ms + hop_overhead_ms_per_ktok * prefix / 1000."""

    hop_overhead_ms: NonNeg
    hop_overhead_ms_per_ktok: NonNeg


class EstimatedFrom(ProfileStruct):
    """An estimated profile's measured `anchor`, the `method` that carried it over and the `target` GPU kind."""

    anchor: str
    method: str
    target: str


class Profile(ProfileStruct, kw_only=True):
    """A whole profile (`Profile.load`, `load_profile`; `save`). Provenance: `created` (ISO date or datetime),
    `source`, `command`, `versions`. Measured profiles add `runtime` and `colocation` (pairs measured side by side);
    `mps` stays the fallback for pairs not measured."""

    schema_version: int
    kind: Literal["analytic", "measured", "estimated"]
    estimated_from: EstimatedFrom | msgspec.UnsetType = msgspec.UNSET  # kind "estimated" only (omitted otherwise)
    # "cpu": measured by `tr calibrate --device cpu`, a check of the tool that says nothing of a GPU's speed; the
    # tools that load such a profile say so (omitted for a GPU's profile)
    device: Literal["cpu"] | msgspec.UnsetType = msgspec.UNSET
    gpu: GpuInfo
    created: str
    source: str
    command: str = ""
    versions: dict[str, str] = msgspec.field(default_factory=dict)
    models: dict[str, ModelProfile]
    router_ms: NonNeg
    sched_ms: NonNeg
    ipc_ms: NonNeg
    link: LinkInfo
    mps: MpsInfo
    std_serving: StdServingInfo
    kv_budget_gb: NonNeg
    runtime: RuntimeInfo | None = None
    colocation: list[CoRunGrid] = msgspec.field(default_factory=list)
    allreduce: AllReduceInfo | None = None
    notes: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def made_on_cpu(self) -> bool:
        return self.device == "cpu"

    def model(self, name: str) -> ModelProfile:
        """The entry for `name` (case-insensitive; `Qwen/Qwen3-8B` accepted). ProfileError lists known ones."""
        key = self.resolve_name(name)
        if key not in self.models:
            degrees = ", ".join(k.partition("@tp")[2] for k in self.models if k.startswith(f"{key}@tp"))
            raise ProfileError(f"profile {self.gpu.name} has {key} only at tp = {degrees}")
        return self.models[key]

    def resolve_name(self, name: str) -> str:
        """The profile's key for `name`; a model measured only at tp > 1 (`NAME@tpK` keys) resolves to NAME."""
        if name in self.models:
            return name
        key = str(name).lower().split("/")[-1]
        if key in self.models or any(k.startswith(f"{key}@tp") for k in self.models):
            return key
        analytic = "; an analytic profile prices any bundled shape (--profile h200-analytic)"
        hint = analytic if self.kind == "measured" else ""
        raise ProfileError(f"profile {self.gpu.name} ({self.kind}) has no model {name!r}; known: "
                           f"{', '.join(self.models)}{hint}")  # fmt: skip

    def entry_at(self, name: str, tp: int) -> ModelProfile | None:
        """The entry measured for `name` at tensor-parallel degree `tp` (the key `NAME@tpK`, else the plain entry when
        its own `tp` is `tp`); None when the profile has neither."""
        key = self.resolve_name(name)
        if f"{key}@tp{tp}" in self.models:
            return self.models[f"{key}@tp{tp}"]
        entry = self.models.get(key)
        return entry if entry is not None and entry.tp == tp else None

    def router_ms_for(self, name: str) -> float:
        m = self.model(name)
        return self.router_ms if m.router_ms is None else m.router_ms

    def kv_budget_gb_for(self, name: str) -> float:
        m = self.model(name)
        return self.kv_budget_gb if m.kv_budget_gb is None else m.kv_budget_gb

    def mps_slowdown(self, model: str, other: str) -> float:
        """Slowdown factor of `model`'s step while `other` runs on the same GPU (default when unmeasured)."""
        a, b = self.resolve_name(model), self.resolve_name(other)
        return self.mps.pairs.get(f"{a}|{b}", self.mps.default_slowdown)

    def to_json(self) -> bytes:
        """Deterministic, indented JSON (field order as declared, model order as inserted), newline-ended."""
        return msgspec.json.format(msgspec.json.encode(self), indent=2) + b"\n"

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.to_json())
        return p

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ProfileError(f"{p}: cannot read profile ({e.strerror or e})") from None
        return cls.from_json(data, source=str(p))

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "<profile>") -> Profile:
        """Decode and validate. `source` names the file in error messages."""
        try:
            raw = msgspec.json.decode(data)
        except msgspec.DecodeError as e:
            raise ProfileError(_one_line(f"{source}: not valid JSON ({e})")) from None
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "<profile>") -> Profile:
        if not isinstance(raw, dict):
            raise ProfileError(f"{source}: top level must be a JSON object, got {type(raw).__name__}")
        # Check the version before the shape: a future schema would otherwise fail with a confusing field error.
        if "schema_version" not in raw:
            raise ProfileError(f"{source}: missing required field `schema_version`")
        ver = raw["schema_version"]
        if type(ver) is int and ver < SCHEMA_VERSION:
            raise ProfileError(f"{source}: schema_version {ver} is older than this version's {SCHEMA_VERSION}: make it "
                               "again (`tr calibrate` on the GPU, or `python -m tokenrouter.calibration.analytic` for "
                               "an analytic one)")  # fmt: skip
        if type(ver) is not int or ver != SCHEMA_VERSION:
            raise ProfileError(f"{source}: unsupported schema_version {ver!r} (this version reads {SCHEMA_VERSION})")
        try:
            prof = msgspec.convert(raw, cls)
        except msgspec.ValidationError as e:
            raise ProfileError(_one_line(f"{source}: {_name_model(str(e), raw)}")) from None
        prof._check(source)
        return prof

    def _check(self, source: str) -> None:
        """Cross-field invariants msgspec's per-field constraints cannot express."""
        if not self.models:
            raise ProfileError(f"{source}: `models` is empty")
        try:
            (date if len(self.created) <= 10 else datetime).fromisoformat(self.created)
        except ValueError:
            raise ProfileError(f"{source}: `created` is not an ISO date: {self.created!r}") from None
        for key in self.mps.pairs:
            parts = key.split("|")
            if len(parts) != 2 or not all(parts):
                raise ProfileError(f"{source}: mps.pairs key {key!r} must look like 'small|large'")
            if unknown := [m for m in parts if m not in self.models]:
                raise ProfileError(f"{source}: mps.pairs key {key!r} names unknown model {unknown[0]!r}")
        for key, entry in self.models.items():
            base, sep, deg = key.partition("@tp")
            if sep and (not base or not deg.isdigit() or int(deg) < 2 or entry.tp != int(deg)):
                raise ProfileError(f"{source}: models key {key!r}: a tp entry is NAME@tpK with K >= 2 and tp: K")
        for grid in self.colocation:
            _check_grid(grid, self.models, source)
        for name, m in self.models.items():
            if m.passes is not None:
                for kind in ("decode", "varlen", "eager"):
                    t = getattr(m.passes, kind)
                    if t is not None and (not t.knots or len(t.knots) != len(t.knot_ms) or t.knots != sorted(t.knots)):
                        raise ProfileError(f"{source}: models[{name!r}].passes.{kind}: knots must be sorted, "
                                           "non-empty and as many as knot_ms")  # fmt: skip


def _check_grid(g: CoRunGrid, models: dict[str, ModelProfile], source: str) -> None:
    where = f"{source}: colocation {g.model_a}|{g.model_b} ({g.arrangement})"
    for m in (g.model_a, g.model_b):
        if m not in models:
            raise ProfileError(f"{where}: unknown model {m!r}")
    na, nb = len(g.batches_a), len(g.batches_b)
    if not na or not nb or len(g.reference_a_ms) != na or len(g.reference_b_ms) != nb or not g.shares:
        raise ProfileError(f"{where}: batches, references and shares must be non-empty and match")
    if g.batches_a != sorted(g.batches_a) or g.batches_b != sorted(g.batches_b):
        raise ProfileError(f"{where}: batch sizes must be sorted")
    for s in g.shares:
        shapes = (len(s.alone_a_ms), len(s.alone_b_ms), len(s.corun_a_ms), len(s.corun_b_ms))
        rows = {len(r) for r in (*s.corun_a_ms, *s.corun_b_ms)}
        if shapes != (na, nb, na, na) or rows != {nb}:
            raise ProfileError(f"{where}: split {s.share_a}/{s.share_b} is not a {na} x {nb} grid")
        if min((*s.alone_a_ms, *s.alone_b_ms, *(x for r in (*s.corun_a_ms, *s.corun_b_ms) for x in r))) <= 0:
            raise ProfileError(f"{where}: split {s.share_a}/{s.share_b} has a non-positive step time")
    if min((*g.reference_a_ms, *g.reference_b_ms)) <= 0:
        raise ProfileError(f"{where}: reference step times must be > 0")


def _name_model(msg: str, raw: dict[str, Any]) -> str:
    """msgspec writes dict keys as `[...]`; name the offending model so the user can find it."""
    models = raw.get("models")
    if "$.models[...]" not in msg or not isinstance(models, dict):
        return msg
    for name, entry in models.items():
        try:
            msgspec.convert(entry, ModelProfile)
        except msgspec.ValidationError:
            return msg.replace("$.models[...]", f"$.models[{name!r}]")
    return msg


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def bundled_profile_dir() -> Path:
    return Path(str(resources.files("tokenrouter.calibration").joinpath("profiles")))


def bundled_profile_names() -> list[str]:
    d = bundled_profile_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def find_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile | None:
    """A profile file by path, or a bundled profile by name (`NAME.json`, `NAME-measured.json`, then
    `NAME-analytic.json`); None for a name that is neither."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_file() or len(p.parts) > 1:
        if not p.exists():
            raise ProfileError(f"{p}: profile file not found")
        return Profile.load(p)
    name = str(name_or_path).lower()
    d = bundled_profile_dir()
    for stem in (name, f"{name}-measured", f"{name}-analytic"):
        f = d / f"{stem}.json"
        if f.is_file():
            return Profile.load(f)
    return None
