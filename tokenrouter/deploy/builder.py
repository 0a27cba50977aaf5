"""Deployment config -> everything a driver runs: routers, KV pools, schedulers, sync gate, graph rules, admission,
engine settings and the peer-message wiring (docs/core.md, "The deployment builder"). Nothing here imports simpy,
asyncio or torch: the simulator and every runtime subserver call `build_deployment`; only the driver differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.admission import Admission, PoolSize
from tokenrouter.core.config import DeploymentConfig, RouterConfig
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Action, PeerMsg
from tokenrouter.core.names import Baseline
from tokenrouter.core.policy import SyncGate
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.deploy.engine_args import engine_kwargs
from tokenrouter.deploy.kv_budget import kv_capacity_tokens
from tokenrouter.deploy.placement import colocated
from tokenrouter.models import load_spec
from tokenrouter.routers import TraceRouter, router_law, synthetic_router
from tokenrouter.workloads import load_hop_trace

Runs = Sequence[tuple[int, int]]


@dataclass(slots=True)
class Deployment:
    """A built deployment; index i is model i everywhere. The driver carries each `Send` to `deliver` (order kept per
    link) and, after any call that changed subserver i, asks `schedule()` again on every subserver in `wakes(i)`."""

    config: DeploymentConfig
    schedulers: list[Scheduler]
    graph_rules: list[GraphRule]
    kv_tokens: list[int]  # token capacity of each model's pool
    gate: SyncGate | None
    engine_args: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_models(self) -> int:
        return len(self.schedulers)

    @property
    def entry(self) -> Scheduler:
        return self.schedulers[self.config.entry]

    @property
    def std_serving(self) -> bool:
        """Standard-serving mode: the driver treats every returning hop as a new request (prefix re-match)."""
        return self.config.baseline == Baseline.STD_SERVING

    def deliver(self, msg: PeerMsg, now: float) -> list[Action]:
        """A message reached its destination: the destination's reaction, to be dispatched like any other."""
        return self.schedulers[msg.dst].resume(msg, now)

    def wakes(self, model: int) -> Sequence[int]:
        """Subservers whose launch decision may change when subserver `model`'s state changes: all of them
        under a sync gate (the gate is shared), else `model` alone."""
        return range(self.num_models) if self.gate is not None else (model,)

    def set_router(self, model: int, router: Router) -> None:
        """Give subserver `model` another router (the runtime's learned routers need the engine, which needs this
        deployment's KV pool), before any request reaches the scheduler."""
        sched = self.schedulers[model]
        if sched.reqs or sched.admit_queue or sched.inflight:
            raise RuntimeError("set_router after requests reached the scheduler")
        sched.router = router.bind(model, self.num_models)

    def colocated(self, model: int) -> list[int]:
        """Models that share a GPU with `model` under MPS (their steps slow each other down)."""
        return colocated(self.config, model)


def build_router(rc: RouterConfig, num_models: int, seed: int, traces: Mapping[str, Runs] | None = None) -> Router:
    """One router instance (build one per subserver). A trace router replays `traces` or `rc.trace`."""
    if rc.name == "trace":
        runs = traces if traces else {s.rid: s.runs or [] for s in (load_hop_trace(rc.trace) if rc.trace else [])}
        if not runs:
            raise ValueError("router 'trace' needs a hop trace: --trace FILE or a workload with runs")
        return TraceRouter(runs)
    return synthetic_router(router_law(rc, num_models), seed)


def max_context_len(cfg: DeploymentConfig) -> int:
    """The longest request every model can run: the smallest `max_position_embeddings`, or the scheduler's
    `max_model_len` when set; ValueError for a `max_model_len` longer than a model's context."""
    limits = {m.name: load_spec(m.path or m.name).max_position_embeddings for m in cfg.models}
    name, limit = min(limits.items(), key=lambda kv: kv[1])
    mml = cfg.scheduler.max_model_len
    if mml is not None and mml > limit:
        raise ValueError(f"max_model_len {mml} (--max-model-len or the config's scheduler.max_model_len) is longer "
                         f"than {name}'s context of {limit} tokens (max_position_embeddings): give at most {limit}, "
                         "or leave it out to serve the models' own limit")  # fmt: skip
    return limit if mml is None else mml


def build_deployment(cfg: DeploymentConfig, *, gpu_memory_gb: float, seed: int = 0,
                     traces: Mapping[str, Runs] | None = None, gate: SyncGate | None = None) -> Deployment:  # fmt: skip
    """Build every subserver of `cfg`. `gpu_memory_gb`: one GPU's memory (sizes the KV pools); `seed`: routers
    and dummy weights; `traces`: hop runs per request id for the trace router (else `cfg.router.trace`);
    `gate`: for a sync policy, an object with `SyncGate`'s interface to use instead of a local `SyncGate` (the
    runtime passes its `RemoteGate`, backed by one `SyncGate` in the launcher)."""
    m = len(cfg.models)
    sc = cfg.scheduler
    policy = cfg.policy.build()
    if not policy.is_sync:
        gate = None
    elif gate is None:
        gate = SyncGate(policy.kind, m)
    caps = kv_capacity_tokens(cfg, gpu_memory_gb)
    pools = [KVPool(c // sc.page_size + 1, sc.page_size) for c in caps]
    sizes = [PoolSize(p.num_pages - 1, p.page_size) for p in pools]
    admission = Admission(sizes, sc.kv_growth_tokens) if sc.kv_admission else None
    context = max_context_len(cfg)
    rules = [mc.graph_rule() for mc in cfg.models]
    schedulers = [Scheduler(i, m, kv=pools[i], router=build_router(cfg.router, m, seed, traces), policy=policy,
                            entry=cfg.entry, max_batch_size=sc.max_batch_size, max_batch_tokens=sc.max_batch_tokens,
                            gate=gate, overlap=cfg.overlaps(i), graph_rule=rules[i],
                            admission=admission if i == cfg.entry else None, max_context_len=context)
                  for i in range(m)]  # fmt: skip
    engine_args = [engine_kwargs(cfg, i, pools[i].num_pages, seed) for i in range(m)]
    return Deployment(cfg, schedulers, rules, caps, gate, engine_args)
