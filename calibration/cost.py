"""Cost model: how long a step, a peer message, the router and the scheduler take (all in ms).

`CostModel(profile, placement)` turns a `Profile` into per-model `ModelCost` objects, resolved once, so the
simulator's hot path (~1e5 steps a run) is a handful of float operations. The step formula (coefficients or
measured passes), co-location and the costs on top of a pass: docs/calibration.md, The cost model.
`ConstantCost` is the Markov model's assumption: step time by model (and optionally batch size), nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from tokenrouter.core.names import Placement, parse_name
from tokenrouter.models.spec import load_spec

from .estimate import profile_label
from .interference import Interference, pair_interference
from .measured import HostCosts, RouterCost
from .passes import ModelPasses
from .profile import Profile, ProfileError, StepCoeffs
from .resolve import load_profile
from .step_stats import PartStats, StepStats
from .tensor_parallel import AllReduceCost, estimate_tp

ModelKey = str | int


@runtime_checkable
class ModelStepCost(Protocol):
    """Costs of one model, resolved once. All times in ms."""

    name: str
    router_ms: float
    sched_ms: float

    def step_ms(self, stats: StepStats) -> float: ...

    def host_ms(self, rows: int) -> float: ...

    def router_step_ms(self, rows: int) -> float: ...


@runtime_checkable
class StepCost(Protocol):
    """What the simulator needs from a cost model. `model` is a name or an index into the model list. A class that
    derives from it gets the defaults below: no overlap cost, no prepare margin, no coordinator round trips, every
    price measured."""

    def for_model(self, model: ModelKey) -> ModelStepCost: ...

    def message_ms(self, nbytes: int = 0) -> float: ...

    def router_ms(self, model: ModelKey | None = None) -> float: ...

    def sched_ms(self, model: ModelKey | None = None) -> float: ...

    def interference(self, model: int, peer: int) -> Interference: ...

    def overlap_frac(self, model: ModelKey) -> float:
        return 0.0

    def prepare_margin_ms(self) -> float | None:
        return None

    def gate_ms_per_step(self, policy: str) -> float:
        return 0.0

    def notes(self) -> list[str]:
        return []


def _part_ms(c: StepCoeffs, p: PartStats) -> float:
    return c.c0 + c.c_row * p.rows + c.c_ctx * p.context_tokens + c.c_tok * p.tokens + c.c_ext * p.extend_tokens


@dataclass(slots=True)
class ModelCost:
    """One model's costs: measured passes when the profile has them, else graph and eager coefficients; host
    and router costs."""

    name: str
    hop_ms: float
    hop_ms_per_tok: float
    router_ms: float
    sched_ms: float
    graph: StepCoeffs
    eager: StepCoeffs
    passes: ModelPasses | None = None
    host: HostCosts | None = None
    learned_router: RouterCost | None = None
    tp: int = 1
    estimated: str = ""  # why these numbers are not measured ("" when the profile has the model at this tp)

    def step_ms(self, stats: StepStats) -> float:
        """Step time (ms) alone on the GPU with no SM cap (see the module docstring); co-location is the
        simulator's (`CostModel.interference`)."""
        g, e = stats.graph, stats.eager
        if not g.rows and not e.rows:
            return 0.0
        if self.passes is not None:
            t = self._measured_ms(stats)
        else:
            gpu = floor = 0.0
            if g.rows:
                gpu += _part_ms(self.graph, g)
                floor = self.graph.floor_ms
            if e.rows:
                gpu += _part_ms(self.eager, e)
                floor = max(floor, self.eager.floor_ms)
            t = gpu if gpu > floor else floor
        if stats.rematch_rows:
            t += stats.rematch_rows * self.hop_ms + stats.rematch_prefix_tokens * self.hop_ms_per_tok
        return t

    def _measured_ms(self, stats: StepStats) -> float:
        p = self.passes
        assert p is not None
        g, e = stats.graph, stats.eager
        t = 0.0
        if g.rows:
            t += p.decode(g.tokens, g.rows, g.context_tokens, g.extend_tokens)
        if e.rows:
            t += p.varlen_pass(e.tokens, e.rows, e.context_tokens, e.extend_tokens, e.long_rows, stats.graphs)
        return t

    def host_ms(self, rows: int) -> float:
        """Host time of the loop per step (forming, planning, post-processing): visible without overlap."""
        return self.sched_ms if self.host is None else self.host.c0_ms + self.host.row_ms * rows

    def router_step_ms(self, rows: int) -> float:
        """The router's device part in a step: the measured learned router's, else the profile's constant."""
        r = self.learned_router
        return self.router_ms if r is None else r.c0_ms + r.row_ms * rows


class CostModel:
    """Profile-driven `StepCost`.

    models: the deployment's model names in index order (default: every model in the profile). shares: each
    model's MPS SM share in percent (None or 100: no cap). learned_router: its measured device part is priced (a
    synthetic router costs nothing). tp: each model's degree (an entry at it, else an estimate, listed in
    `notes()`). profiles: the profile of the GPU each model runs on (None: `profile`) for its passes, host costs
    and KV budget; messages, runtime costs and co-location come from `profile`.
    """

    def __init__(self, profile: Profile | str | Path = "h200", placement: Placement | str = Placement.MPS, *,
                 models: Sequence[str] | None = None, shares: Sequence[int | None] | None = None,
                 learned_router: str | None = None, tp: Sequence[int] | None = None,
                 profiles: Sequence[Profile | None] | None = None) -> None:  # fmt: skip
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.placement = parse_name(Placement, placement, "placement")
        default = [k for k in self.profile.models if "@tp" not in k]  # a NAME@tpK key is NAME at another degree
        self.models: tuple[str, ...] = tuple(self.profile.resolve_name(m) for m in (models or default))
        shares = list(shares or [])
        if shares and len(shares) != len(self.models):
            raise ValueError(f"shares: one per model ({len(self.models)}), got {len(shares)}")
        self.shares: tuple[int, ...] = tuple(100 if not s else int(s) for s in shares) or (100,) * len(self.models)
        tps = list(tp or [])
        if tps and len(tps) != len(self.models):
            raise ValueError(f"tp: one per model ({len(self.models)}), got {len(tps)}")
        if any(t < 1 for t in tps):
            raise ValueError(f"tp must be >= 1, got {tps}")
        self.tp: tuple[int, ...] = tuple(int(t) for t in tps) or (1,) * len(self.models)
        own = list(profiles or [])
        if own and len(own) != len(self.models):
            raise ValueError(f"profiles: one per model ({len(self.models)}), got {len(own)}")
        self.profiles: tuple[Profile, ...] = tuple(p or self.profile for p in own) or (self.profile,) * len(self.models)
        self._notes: dict[str, str] = {}  # what is estimated rather than measured, in the order it was met
        self.learned_router = learned_router
        link = self.profile.link
        self._link_latency_ms = link.latency_ms
        self._link_ms_per_byte = 8.0 / (link.bandwidth_gbps * 1e6)  # Gbit/s -> ms per byte
        self._cache: dict[ModelKey, ModelCost] = {}
        rt = self.profile.runtime
        self._ipc_ms = rt.ipc_ms if rt is not None else self.profile.ipc_ms

    @property
    def measured(self) -> bool:
        return all(p.kind == "measured" for p in (self.profile, *self.profiles))

    def for_model(self, model: ModelKey) -> ModelCost:
        """The resolved per-model cost object (cached); `model` is a name or an index into `models`."""
        mc = self._cache.get(model)
        if mc is None:
            name = self._name(model)
            i = model if isinstance(model, int) else self.models.index(name) if name in self.models else None
            mc = self._build(name, 1, self.profile) if i is None else self._build(name, self.tp[i], self.profiles[i])
            self._cache[model] = mc
        return mc

    def notes(self) -> list[str]:
        """What the prices so far rest on that the profile did not measure (tp estimates, co-location of a tp
        model), one line each; empty when everything priced was measured (or the profile is analytic at tp=1)."""
        for i, p in enumerate(self.profiles):
            self.for_model(i)
            if profile_label(p):
                self._notes[f"est:{self.models[i]}"] = f"{self.models[i]}: {profile_label(p)}"
        return [v for k, v in sorted(self._notes.items(), key=lambda kv: not kv[0].startswith("tp:"))]

    def _name(self, model: ModelKey) -> str:
        if isinstance(model, int):
            if not 0 <= model < len(self.models):
                raise ProfileError(f"model index {model} out of range; models: {', '.join(self.models)}")
            return self.models[model]
        return self.profile.resolve_name(model)

    def _build(self, name: str, tp: int, p: Profile) -> ModelCost:
        m = p.entry_at(name, tp)
        estimated = ""
        if m is None and tp == 1:
            have = p.model(name).tp
            raise ProfileError(f"profile {p.gpu.name} has {name} at tp={have} only, not tp=1 (give --tp {have})")
        if m is None:
            est = estimate_tp(p.model(name), load_spec(name), tp, AllReduceCost.of(p.allreduce), name)
            m, estimated = est.entry, est.note
            self._notes[f"tp:{name}:{tp}"] = estimated
        learned = m.routers.get(self.learned_router) if self.learned_router else None
        return ModelCost(name=name, hop_ms=p.std_serving.hop_overhead_ms,
                         hop_ms_per_tok=p.std_serving.hop_overhead_ms_per_ktok / 1000.0,
                         router_ms=0.0 if m.passes is not None and learned is None else p.router_ms_for(name),
                         sched_ms=p.sched_ms, graph=m.step.graph, eager=m.step.eager,
                         passes=ModelPasses.of(m.passes) if m.passes is not None else None, host=m.host,
                         learned_router=learned, tp=tp, estimated=estimated)  # fmt: skip

    def interference(self, model: int, peer: int) -> Interference:
        """Model `model`'s slowdown factors beside model `peer` on one GPU (indices into `models`): measured
        when the profile has the pair under MPS, else the profile's constant MPS factor. ColocationError when
        the pair was measured but not at these SM shares."""
        a, b = self._name(model), self._name(peer)
        prof = self.profiles[model]
        if prof.gpu != self.profiles[peer].gpu:
            raise ProfileError(f"{a} and {b} share a GPU but are priced from profiles of different GPUs")
        for g in prof.colocation:
            if g.arrangement == "mps" and {g.model_a, g.model_b} == {a, b}:
                if max(self.tp[model], self.tp[peer]) > 1:
                    self._note_colocation(a, b, model, peer, "the pair's measured tp=1 co-location factors")
                return pair_interference(g, a, self.shares[model], self.shares[peer])
        factor = prof.mps_slowdown(a, b)
        if max(self.tp[model], self.tp[peer]) > 1:
            self._note_colocation(a, b, model, peer, f"the profile's constant MPS factor x{factor:.2f}")
        return Interference.fixed(factor)

    def _note_colocation(self, a: str, b: str, i: int, j: int, what: str) -> None:
        pair = tuple(sorted((f"{a} (tp={self.tp[i]})", f"{b} (tp={self.tp[j]})")))
        self._notes[f"coloc:{pair}"] = (f"{pair[0]} beside {pair[1]} on one GPU: ASSUMED {what}, applied while the "
                                         "passes overlap (the tp model's rank on the shared GPU slows as the whole "
                                         "model did, and its other ranks wait for it at every all-reduce)")  # fmt: skip

    def message_ms(self, nbytes: int = 0) -> float:
        """One peer message: the measured (or assumed) ipc time on one host; latency + bytes / bandwidth across
        hosts."""
        if self.placement is Placement.CROSS_HOST:
            return self._link_latency_ms + nbytes * self._link_ms_per_byte
        return self._ipc_ms

    def router_ms(self, model: ModelKey | None = None) -> float:
        """Router cost per step (ms); per-model override when the profile has one."""
        return self.profile.router_ms if model is None else self.for_model(model).router_ms

    def sched_ms(self, model: ModelKey | None = None) -> float:
        """Host time to schedule and post-process one step (ms): visible without overlap, hidden with it."""
        return self.profile.sched_ms if model is None else self.for_model(model).host_ms(1)

    def overlap_frac(self, model: ModelKey) -> float:
        """With overlap: the fraction of each step's GPU time the loop adds (measured; 0 in analytic profiles)."""
        host = self.for_model(model).host
        return 0.0 if host is None else host.overlap_frac

    def prepare_margin_ms(self) -> float | None:
        """With overlap: how long before step k's end the runtime forms step k+1 (None: not measured)."""
        rt = self.profile.runtime
        return None if rt is None else rt.prepare_margin_ms

    def gate_ms_per_step(self, policy: str) -> float:
        """Sync policies: the coordinator round trips a step pays (measured count x round-trip time)."""
        rt = self.profile.runtime
        return 0.0 if rt is None else rt.gate_rtts_per_step.get(str(policy), 0.0) * rt.gate_rtt_ms

    def kv_budget_gb(self, model: ModelKey) -> float:
        name = self._name(model)
        return (self.profiles[self.models.index(name)] if name in self.models else self.profile).kv_budget_gb_for(name)


# -- constant step times (the Markov model's assumption) ---------------------------------------------------

LatencySpec = float | Callable[[int], float]


@dataclass(slots=True)
class ConstantModelCost:
    """Step time L(b) of one model: a constant, or a function of batch size."""

    name: str
    latency: LatencySpec
    router_ms: float = 0.0
    sched_ms: float = 0.0

    def __post_init__(self) -> None:
        if not callable(self.latency) and float(self.latency) < 0:
            raise ValueError(f"negative step time for {self.name}: {self.latency}")

    def step_ms(self, stats: StepStats) -> float:
        n, lat = stats.rows, self.latency
        if n == 0:
            return 0.0
        return float(lat(n)) if callable(lat) else float(lat)

    def host_ms(self, rows: int) -> float:
        return self.sched_ms

    def router_step_ms(self, rows: int) -> float:
        return self.router_ms


class ConstantCost(StepCost):
    """`StepCost` with L_i per model and nothing else: messages, router, overlap and coordinator cost 0, and so
    does the host's scheduling unless `sched_ms` is given (tests of overlap use it). latency_ms: by model index
    (a sequence) or by name and/or index (a mapping); each a constant (ms) or a function of batch size."""

    def __init__(self, latency_ms: Sequence[LatencySpec] | Mapping[ModelKey, LatencySpec], *,
                 sched_ms: float = 0.0) -> None:  # fmt: skip
        items = latency_ms.items() if isinstance(latency_ms, Mapping) else enumerate(latency_ms)
        self._costs: dict[ModelKey, ConstantModelCost] = {k: ConstantModelCost(str(k), v, sched_ms=sched_ms)
                                                          for k, v in items}  # fmt: skip
        if not self._costs:
            raise ValueError("ConstantCost needs at least one model")
        self._sched_ms = sched_ms

    def for_model(self, model: ModelKey) -> ConstantModelCost:
        mc = self._costs.get(model)
        if mc is None and isinstance(model, str):
            mc = self._costs.get(model.lower())
        if mc is None:
            raise KeyError(f"no step time for model {model!r}; known: {', '.join(map(str, self._costs))}")
        return mc

    def message_ms(self, nbytes: int = 0) -> float:
        return 0.0

    def router_ms(self, model: ModelKey | None = None) -> float:
        return 0.0

    def sched_ms(self, model: ModelKey | None = None) -> float:
        return self._sched_ms

    def interference(self, model: int, peer: int) -> Interference:
        """Constant step times: co-located models do not slow each other (the Markov model's assumption)."""
        return Interference.fixed(1.0)
