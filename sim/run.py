"""`run_sim`: build a deployment in a simpy environment, drive it with a workload, collect metrics.

The deployment is the same `DeploymentConfig` that `tr serve` reads; the schedulers, routers and KV
accounting are the core's. Only time is simulated: step times from the profile's cost model, peer
messages delayed by the link model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import simpy

from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.profile import load_profile
from tokenrouter.core.batch import Batch
from tokenrouter.core.config import DeploymentConfig, joint_kv_tokens
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Action, Emit, Finish, PeerReq, Send
from tokenrouter.core.policy import SyncGate
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.models import load_spec
from tokenrouter.routers import TraceRouter, make_preset
from tokenrouter.sim.clients import ClosedLoop, OpenLoop
from tokenrouter.sim.metrics import MetricsCollector
from tokenrouter.sim.subserver import SimSubserver
from tokenrouter.workloads import RequestSpec, load_hop_trace, make_workload

# Fraction of GPU memory an engine may use (weights + KV), as serving engines leave headroom.
MEM_FRACTION = 0.9


@dataclass(slots=True)
class SimConfig:
    deployment: DeploymentConfig
    workload: str = "low-effort"
    num_requests: int = 64
    concurrency: int = 8
    arrival_rate: float | None = None  # requests/s: open loop; None: closed loop with `concurrency` clients
    seed: int = 0
    max_output: int | None = None
    cost: Any = None  # a StepCost to use instead of the profile's (tests use ConstantCost)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.arrival_rate is not None and self.arrival_rate <= 0:
            raise ValueError(f"arrival rate must be > 0, got {self.arrival_rate}")


@dataclass(slots=True)
class SimResult:
    summary: dict[str, float]
    metrics: MetricsCollector
    config: SimConfig
    thresholds: tuple[int, ...]
    analytic: bool
    window: tuple[float, float] | None
    kv_tokens: list[int]
    wall_s: float
    preemptions: int
    extra: dict[str, Any] = field(default_factory=dict)


def build_router(dep: DeploymentConfig, specs: list[RequestSpec], seed: int) -> Router:
    rc = dep.router
    if rc.name == "trace":
        traced = specs if any(s.runs for s in specs) else (load_hop_trace(rc.trace) if rc.trace else [])
        if not traced:
            raise ValueError("router 'trace' needs a hop trace: --trace FILE or a workload with runs")
        return TraceRouter({s.rid: s.runs or [] for s in traced})
    return make_preset(
        rc.name,
        hop_rate=rc.hop_rate,
        return_prob=rc.return_prob,
        mean_small_run=rc.mean_small_run,
        mean_large_run=rc.mean_large_run,
        num_models=len(dep.models),
        seed=seed,
    )


def kv_capacity_tokens(dep: DeploymentConfig, profile: Any) -> list[int]:
    """Token capacity per model. Co-located models (mps) split the free memory so each gets the same
    capacity; a model on its own GPUs gets what its weights leave, unless `kv_budget_gb` is given.
    """
    specs = [load_spec(m.name) for m in dep.models]
    gpu_bytes = profile.gpu.memory_gb * 1e9 * MEM_FRACTION
    caps: list[int] = []
    for m, spec in zip(dep.models, specs, strict=True):
        if m.kv_budget_gb is not None:
            caps.append(int(m.kv_budget_gb * 1e9 // spec.kv_bytes_per_token))
        elif dep.placement.mode == "mps":
            sharing = [s for mm, s in zip(dep.models, specs, strict=True) if set(mm.gpus) & set(m.gpus)]
            free = gpu_bytes * len(m.gpus) - sum(
                s.weight_bytes / max(1, len(mm.gpus)) * len(m.gpus)
                for mm, s in zip(dep.models, specs, strict=True)
                if s in sharing
            )
            caps.append(joint_kv_tokens(free, [s.kv_bytes_per_token for s in sharing]))
        else:
            caps.append(int((gpu_bytes * len(m.gpus) - spec.weight_bytes) // spec.kv_bytes_per_token))
    for m, c in zip(dep.models, caps, strict=True):
        if c < dep.scheduler.page_size:
            raise ValueError(f"model {m.name}: no memory left for KV cache on its GPUs")
    return caps


def run_sim(cfg: SimConfig) -> SimResult:
    t_wall = time.perf_counter()
    dep = cfg.deployment
    num_models = len(dep.models)
    profile = load_profile(dep.profile)
    names = [m.name for m in dep.models]
    cost = cfg.cost if cfg.cost is not None else CostModel(profile, dep.placement.mode, models=names)
    analytic = cfg.cost is None and profile.kind == "analytic"
    specs = make_workload(
        cfg.workload, cfg.num_requests, cfg.seed, arrival_rate=cfg.arrival_rate, max_output=cfg.max_output
    )
    router_proto = build_router(dep, specs, cfg.seed)
    policy = dep.policy.build()
    gate = SyncGate(policy.kind, num_models) if policy.is_sync else None
    caps = kv_capacity_tokens(dep, profile)
    ps = dep.scheduler.page_size

    env = simpy.Environment()
    metrics = MetricsCollector(num_models)
    subs: list[SimSubserver] = []
    for i, mc in enumerate(dep.models):
        router = router_proto if i == 0 else _clone_router(router_proto)
        sched = Scheduler(
            i,
            num_models,
            kv=KVPool(caps[i] // ps + 1, ps),
            router=router,
            policy=policy,
            entry=dep.entry,
            max_batch_size=dep.scheduler.max_batch_size,
            max_batch_tokens=dep.scheduler.max_batch_tokens,
            gate=gate,
        )
        mcost = cost.for_model(i)
        overhead = cost.router_ms(i) + (0.0 if dep.scheduler.overlap else cost.sched_ms(i))
        max_bucket = max(mc.graph_buckets) if mc.cuda_graphs else 0

        def step_ms(batch: Batch, corunning: bool, _c=mcost, _mb=max_bucket, _mt=mc.graph_max_row_tokens) -> float:
            # As the engine does: a step runs in a graph when its rows, each unrolled into one decode row
            # per token, fit the largest bucket and no row is longer than graph_max_row_tokens.
            rows = batch.rows
            graph = batch.num_tokens <= _mb and all(r.num_tokens <= _mt for r in rows)
            return _c.step_ms(batch, graph=graph, corunning=corunning)

        subs.append(SimSubserver(env, sched, step_ms=step_ms, overhead_ms=overhead, metrics=metrics))
    if dep.placement.mode == "mps":
        for a in subs:
            a.colocated = [
                b for b in subs if b is not a and set(dep.models[a.model].gpus) & set(dep.models[b.model].gpus)
            ]

    done: dict[str, simpy.Event] = {}
    kick_all = gate is not None

    def deliver(msg: PeerReq) -> None:
        dst = subs[msg.dst]
        dispatch(dst.sched.resume(msg, env.now))
        if kick_all:
            for s in subs:
                s.kick()
        else:
            dst.kick()

    def delayed_delivery(msg: PeerReq, delay_s: float):
        yield env.timeout(delay_s)
        deliver(msg)

    def dispatch(actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                delay = cost.message_ms(a.msg.nbytes) / 1000.0
                if delay > 0:
                    env.process(delayed_delivery(a.msg, delay))
                else:
                    deliver(a.msg)
            elif isinstance(a, Emit):
                metrics.on_tokens(a.rid, len(a.tokens), env.now, a.model)
            elif isinstance(a, Finish):
                metrics.on_finish(a.rid, env.now, a.num_hops)
                ev = done.pop(a.rid, None)
                if ev is not None:
                    ev.succeed()
        if kick_all:
            for s in subs:
                s.kick()

    for s in subs:
        s.dispatch = dispatch
    entry = subs[dep.entry]

    def submit(spec: RequestSpec) -> simpy.Event:
        ids = list(spec.prompt_ids) if spec.prompt_ids else [0] * spec.prompt_len
        req = Request(
            spec.rid,
            ids,
            len(ids),
            SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
            num_models=num_models,
            entry=dep.entry,
        )
        ev = env.event()
        done[spec.rid] = ev
        metrics.on_arrival(spec.rid, env.now, len(ids))
        entry.sched.add(req, env.now)
        entry.kick()
        return ev

    loader = (
        OpenLoop(env, specs, submit)
        if cfg.arrival_rate is not None or _has_arrivals(specs)
        else ClosedLoop(env, specs, cfg.concurrency, submit)
    )
    env.run()
    if done:
        raise RuntimeError(f"simulation stalled with {len(done)} requests unfinished (scheduler deadlock?)")
    window = None
    if isinstance(loader, ClosedLoop) and loader.exhausted_at and loader.exhausted_at > 0:
        window = (0.0, loader.exhausted_at)
    summary = metrics.summary(window=window)
    return SimResult(
        summary=summary,
        metrics=metrics,
        config=cfg,
        thresholds=subs[0].sched.policy.thresholds_for(cfg.concurrency, num_models),
        analytic=analytic,
        window=window,
        kv_tokens=caps,
        wall_s=time.perf_counter() - t_wall,
        preemptions=sum(s.sched.num_preemptions for s in subs),
    )


def _has_arrivals(specs: list[RequestSpec]) -> bool:
    return any(s.arrival is not None for s in specs)


def _clone_router(r: Router) -> Router:
    import copy

    return copy.deepcopy(r)
