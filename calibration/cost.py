"""Cost model: how long a step, a peer message, the router and the scheduler take (all in ms).

`CostModel(profile, placement)` turns a `Profile` into per-model `ModelCost` objects with the coefficients
unpacked into slots, so the simulator's hot path (~1e5 steps a run) is a handful of float operations:

    mc = cost.for_model("qwen3-0.6b")         # resolve once (name, or index into `models`)
    t = mc.step_ms(batch, corunning=True)     # per step

Step time, for B rows feeding T tokens (E of them in extend/prefill rows), attending C context tokens,
R re-matched rows (standard-serving baseline) with P prefix tokens in total:

    gpu_ms  = c0 + c_row*B + c_ctx*C + c_tok*T + c_ext*E        (graph or eager coefficients)
    gpu_ms *= mps slowdown            only when placement == "mps" and the step co-runs with another model
    step_ms = max(gpu_ms, floor_ms) + R*hop_overhead_ms + (P/1000)*hop_overhead_ms_per_ktok

The re-match bookkeeping is host work, so MPS does not slow it. An empty batch costs 0.
`ConstantCost` has the same interface with step time depending only on the model (and optionally batch
size), and zero message/router/scheduler costs: it is what the Markov throughput model assumes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from .profile import Profile, ProfileError, StepCoeffs, load_profile

Placement = Literal["mps", "separate", "cross-host"]
PLACEMENTS: tuple[str, ...] = ("mps", "separate", "cross-host")
ModelKey = str | int


def batch_summary(batch: Any) -> tuple[int, int, int, int, int, int]:
    """(batch_size, num_tokens, extend_tokens, context_tokens, num_rematch, rematch_context_tokens).

    One pass over a core `Batch`'s rows (the same sums as its properties, which each walk the rows);
    any other object is read through those property names.
    """
    rows = getattr(batch, "rows", None)
    if rows is None:
        return (
            batch.size,
            batch.num_tokens,
            batch.num_extend_tokens,
            batch.context_tokens,
            batch.num_rematch,
            batch.rematch_context_tokens,
        )
    tok = ext = ctx = rm = rm_ctx = 0
    for r in rows:
        k = r.num_tokens
        tok += k
        ctx += r.start + k
        if k > 1:
            ext += k
        if r.rematch:
            rm += 1
            rm_ctx += r.start
    return len(rows), tok, ext, ctx, rm, rm_ctx


@runtime_checkable
class ModelStepCost(Protocol):
    """Costs of one model, resolved once. All times in ms."""

    name: str
    router_ms: float
    sched_ms: float

    def step_ms(self, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float: ...

    def step_ms_from(
        self,
        batch_size: int,
        num_tokens: int,
        extend_tokens: int,
        context_tokens: int,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float: ...


@runtime_checkable
class StepCost(Protocol):
    """What the simulator needs from a cost model. `model` is a name or an index into the model list."""

    def for_model(self, model: ModelKey) -> ModelStepCost: ...

    def step_ms(self, model: ModelKey, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float: ...

    def step_ms_from(
        self,
        model: ModelKey,
        batch_size: int,
        num_tokens: int,
        extend_tokens: int,
        context_tokens: int,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float: ...

    def message_ms(self, nbytes: int = 0) -> float: ...

    def router_ms(self, model: ModelKey | None = None) -> float: ...

    def sched_ms(self, model: ModelKey | None = None) -> float: ...


@dataclass(slots=True)
class ModelCost:
    """One model's unpacked coefficients (graph `g*`, eager `e*`), placement factors and overheads."""

    name: str
    graph: bool  # default when a call passes graph=None
    graph_max_tokens: int  # steps feeding more tokens than this run eager (outside the captured buckets)
    slowdown: float  # applied when corunning; 1.0 unless placement == "mps"
    hop_ms: float
    hop_ms_per_tok: float
    router_ms: float
    sched_ms: float
    g0: float
    grow: float
    gctx: float
    gtok: float
    gext: float
    gfloor: float
    e0: float
    erow: float
    ectx: float
    etok: float
    eext: float
    efloor: float

    def step_ms(self, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float:
        """Step time (ms) of a core `Batch`."""
        b, t, e, c, rm, rc = batch_summary(batch)
        return self.step_ms_from(b, t, e, c, rm, rc, graph, corunning)

    def step_ms_from(
        self,
        batch_size: int,
        num_tokens: int,
        extend_tokens: int,
        context_tokens: int,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float:
        """Step time (ms) from the batch's summary numbers (see the module docstring for the formula)."""
        if batch_size <= 0:
            return 0.0
        if graph is None:
            graph = self.graph
        if graph and num_tokens <= self.graph_max_tokens:
            t = self.g0 + self.grow * batch_size + self.gctx * context_tokens + self.gtok * num_tokens
            t += self.gext * extend_tokens
            floor = self.gfloor
        else:
            t = self.e0 + self.erow * batch_size + self.ectx * context_tokens + self.etok * num_tokens
            t += self.eext * extend_tokens
            floor = self.efloor
        if corunning:
            t *= self.slowdown
        if t < floor:
            t = floor
        if rematch:
            t += rematch * self.hop_ms + rematch_ctx * self.hop_ms_per_tok
        return t


class CostModel:
    """Profile-driven `StepCost`.

    placement: "mps" (co-located under CUDA MPS: co-running steps slow down), "separate" (own GPUs, one
    host) or "cross-host" (peer messages pay link latency + bytes / bandwidth).
    models: the deployment's model names in index order (so `Batch.model` indices work, and MPS pair
    slowdowns are looked up against the co-located models); default: every model in the profile.
    graphs: CUDA graphs on for all models (bool) or per model name (unlisted models: on); this is the default
    for calls that pass graph=None, and an explicit graph=True/False wins.
    graph_max_tokens: largest step (tokens) the captured graphs cover; bigger steps cost eager. None: no limit.
    """

    def __init__(
        self,
        profile: Profile | str | Path = "h200",
        placement: Placement = "mps",
        *,
        models: Sequence[str] | None = None,
        graphs: bool | Mapping[str, bool] = True,
        graph_max_tokens: int | None = None,
    ) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; expected one of {', '.join(PLACEMENTS)}")
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.placement: str = placement
        self.models: tuple[str, ...] = tuple(self.profile.resolve_name(m) for m in (models or self.profile.models))
        if isinstance(graphs, Mapping):
            self._graphs = {self.profile.resolve_name(k): bool(v) for k, v in graphs.items()}
            self._graph_default = True
        else:
            self._graphs, self._graph_default = {}, bool(graphs)
        self._graph_max = graph_max_tokens if graph_max_tokens is not None else 1 << 62
        link = self.profile.link
        self._link_latency_ms = link.latency_ms
        self._link_ms_per_byte = 8.0 / (link.bandwidth_gbps * 1e6)  # Gbit/s -> ms per byte
        self._cache: dict[ModelKey, ModelCost] = {}

    def for_model(self, model: ModelKey) -> ModelCost:
        """The resolved per-model cost object (cached); `model` is a name or an index into `models`."""
        mc = self._cache.get(model)
        if mc is None:
            mc = self._build(self._name(model))
            self._cache[model] = mc
        return mc

    def _name(self, model: ModelKey) -> str:
        if isinstance(model, int):
            if not 0 <= model < len(self.models):
                raise ProfileError(f"model index {model} out of range; models: {', '.join(self.models)}")
            return self.models[model]
        return self.profile.resolve_name(model)

    def _build(self, name: str) -> ModelCost:
        p = self.profile
        m = p.model(name)
        others = [o for o in self.models if o != name]
        slowdown = 1.0
        if self.placement == "mps":
            slowdown = max((p.mps_slowdown(name, o) for o in others), default=p.mps.default_slowdown)
        g, e = m.step.graph, m.step.eager
        return ModelCost(
            name=name,
            graph=self._graphs.get(name, self._graph_default),
            graph_max_tokens=self._graph_max,
            slowdown=slowdown,
            hop_ms=p.std_serving.hop_overhead_ms,
            hop_ms_per_tok=p.std_serving.hop_overhead_ms_per_ktok / 1000.0,
            router_ms=p.router_ms_for(name),
            sched_ms=p.sched_ms,
            **_unpack("g", g),
            **_unpack("e", e),
        )

    def step_ms(self, model: ModelKey, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float:
        return self.for_model(model).step_ms(batch, graph=graph, corunning=corunning)

    def step_ms_from(
        self,
        model: ModelKey,
        batch_size: int,
        num_tokens: int,
        extend_tokens: int,
        context_tokens: int,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float:
        return self.for_model(model).step_ms_from(
            batch_size, num_tokens, extend_tokens, context_tokens, rematch, rematch_ctx, graph, corunning
        )

    def message_ms(self, nbytes: int = 0) -> float:
        """One peer message: `ipc_ms` on one host; latency + bytes / bandwidth across hosts."""
        if self.placement == "cross-host":
            return self._link_latency_ms + nbytes * self._link_ms_per_byte
        return self.profile.ipc_ms

    def router_ms(self, model: ModelKey | None = None) -> float:
        """Router cost per step (ms); per-model override when the profile has one."""
        return self.profile.router_ms if model is None else self.for_model(model).router_ms

    def sched_ms(self, model: ModelKey | None = None) -> float:
        """CPU scheduling per step (ms); the simulator hides it behind the GPU when async is on."""
        return self.profile.sched_ms

    def kv_budget_gb(self, model: ModelKey) -> float:
        return self.profile.kv_budget_gb_for(self._name(model))


def _unpack(prefix: str, c: StepCoeffs) -> dict[str, float]:
    return {
        f"{prefix}0": c.c0,
        f"{prefix}row": c.c_row,
        f"{prefix}ctx": c.c_ctx,
        f"{prefix}tok": c.c_tok,
        f"{prefix}ext": c.c_ext,
        f"{prefix}floor": c.floor_ms,
    }


# -- constant step times (the Markov model's assumption) ---------------------------------------------------

LatencySpec = float | Callable[[int], float] | Mapping[int, float]


@dataclass(slots=True)
class ConstantModelCost:
    """Step time L(b) of one model: a constant, a function of batch size, or a table {b: ms} (step function:
    the entry of the largest b' <= b, or the smallest entry below the table)."""

    name: str
    latency: LatencySpec
    router_ms: float = 0.0
    sched_ms: float = 0.0
    _keys: list[int] | None = field(default=None, init=False, repr=False)
    _vals: list[float] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.latency, Mapping):
            if not self.latency:
                raise ValueError(f"empty latency table for {self.name}")
            items = sorted((int(k), float(v)) for k, v in self.latency.items())
            self._keys, self._vals = [k for k, _ in items], [v for _, v in items]
        elif not callable(self.latency) and float(self.latency) < 0:
            raise ValueError(f"negative step time for {self.name}: {self.latency}")

    def at(self, batch_size: int) -> float:
        lat = self.latency
        if self._keys is not None:
            i = bisect.bisect_right(self._keys, batch_size) - 1
            return self._vals[max(i, 0)]  # type: ignore[index]
        if callable(lat):
            return float(lat(batch_size))
        return float(lat)  # type: ignore[arg-type]

    def step_ms(self, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float:
        return self.at(batch.size) if batch.size > 0 else 0.0

    def step_ms_from(
        self,
        batch_size: int,
        num_tokens: int = 0,
        extend_tokens: int = 0,
        context_tokens: int = 0,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float:
        return self.at(batch_size) if batch_size > 0 else 0.0


class ConstantCost:
    """`StepCost` with L_i per model and nothing else: messages, router and scheduler cost 0.

    latency_ms: a sequence indexed by model index, or a mapping keyed by model name and/or index; each
    value a constant (ms), a function of batch size, or a {batch_size: ms} table.
    """

    def __init__(self, latency_ms: Sequence[LatencySpec] | Mapping[ModelKey, LatencySpec]) -> None:
        items = latency_ms.items() if isinstance(latency_ms, Mapping) else enumerate(latency_ms)
        self._costs: dict[ModelKey, ConstantModelCost] = {k: ConstantModelCost(str(k), v) for k, v in items}
        if not self._costs:
            raise ValueError("ConstantCost needs at least one model")

    def for_model(self, model: ModelKey) -> ConstantModelCost:
        mc = self._costs.get(model)
        if mc is None and isinstance(model, str):
            mc = self._costs.get(model.lower())
        if mc is None:
            raise KeyError(f"no step time for model {model!r}; known: {', '.join(map(str, self._costs))}")
        return mc

    def step_ms(self, model: ModelKey, batch: Any, *, graph: bool | None = None, corunning: bool = False) -> float:
        return self.for_model(model).step_ms(batch)

    def step_ms_from(
        self,
        model: ModelKey,
        batch_size: int,
        num_tokens: int = 0,
        extend_tokens: int = 0,
        context_tokens: int = 0,
        rematch: int = 0,
        rematch_ctx: int = 0,
        graph: bool | None = None,
        corunning: bool = False,
    ) -> float:
        return self.for_model(model).step_ms_from(batch_size)

    def message_ms(self, nbytes: int = 0) -> float:
        return 0.0

    def router_ms(self, model: ModelKey | None = None) -> float:
        return 0.0

    def sched_ms(self, model: ModelKey | None = None) -> float:
        return 0.0
