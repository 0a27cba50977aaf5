"""`run_sim`: build a deployment in a simpy environment, drive it with a workload, collect metrics.

The deployment is the same `DeploymentConfig` that `tr serve` reads, built by the same
`tokenrouter.deploy.build_deployment`; the schedulers, routers, KV pools and admission are the core's.
Only time is simulated: step times from the profile's cost model, peer messages delayed by the link model.
Standard serving (`policy: std-serving`) is a mode of this driver: every returning hop is priced as a new
request that re-matches its prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import simpy

from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.profile import load_profile
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.messages import Action, Emit, Finish, PeerMsg, PeerReq, Send
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.deploy import Deployment, build_deployment
from tokenrouter.metrics import MetricsCollector
from tokenrouter.sim.clients import ClosedLoop, OpenLoop
from tokenrouter.sim.subserver import SimSubserver
from tokenrouter.workloads import RequestSpec, make_workload


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
    wasted_rows: int = 0  # overlap: prepared rows whose request left before they ran
    rematch_rows: int = 0  # standard serving: rows priced as new requests re-matching their prefix
    extra: dict[str, Any] = field(default_factory=dict)


def run_sim(cfg: SimConfig) -> SimResult:
    t_wall = time.perf_counter()
    dep = cfg.deployment
    profile = load_profile(dep.profile)
    names = [m.name for m in dep.models]
    cost = cfg.cost if cfg.cost is not None else CostModel(profile, dep.placement.mode, models=names)
    analytic = cfg.cost is None and profile.kind == "analytic"
    specs = make_workload(
        cfg.workload, cfg.num_requests, cfg.seed, arrival_rate=cfg.arrival_rate, max_output=cfg.max_output
    )
    traces = {s.rid: s.runs or [] for s in specs} if any(s.runs for s in specs) else None
    deployment = build_deployment(dep, gpu_memory_gb=profile.gpu.memory_gb, seed=cfg.seed, traces=traces)

    env = simpy.Environment()
    metrics = MetricsCollector(deployment.num_models)
    subs = [
        SimSubserver(
            env,
            sched,
            cost=cost.for_model(i),
            rule=deployment.graph_rules[i],
            host_ms=cost.sched_ms(i),
            device_ms=cost.router_ms(i),
            metrics=metrics,
        )
        for i, sched in enumerate(deployment.schedulers)
    ]
    for i, s in enumerate(subs):
        s.colocated = [subs[j] for j in deployment.colocated(i)]
    done: dict[str, simpy.Event] = {}
    wire = _Links(env, deployment, subs, cost, metrics, done)
    for s in subs:
        s.dispatch = wire.dispatch
    entry = subs[dep.entry]

    def submit(spec: RequestSpec) -> simpy.Event:
        ids = list(spec.prompt_ids) if spec.prompt_ids else [0] * spec.prompt_len
        req = Request(
            spec.rid,
            ids,
            len(ids),
            SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
            num_models=deployment.num_models,
            entry=dep.entry,
        )
        ev = env.event()
        done[spec.rid] = ev
        metrics.on_arrival(spec.rid, env.now, len(ids))
        wire.dispatch(dep.entry, entry.sched.add(req, env.now))
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
        thresholds=deployment.entry.policy.thresholds_for(cfg.concurrency, deployment.num_models),
        analytic=analytic,
        window=window,
        kv_tokens=deployment.kv_tokens,
        wall_s=time.perf_counter() - t_wall,
        preemptions=sum(s.sched.num_preemptions for s in subs),
        wasted_rows=sum(s.wasted_rows for s in subs),
        rematch_rows=sum(s.rematch_rows for s in subs),
    )


class _Links:
    """Carries actions: peer messages over the link model (order kept per link), tokens and finishes to the
    metrics and the clients, and wakes the subservers the deployment says to."""

    def __init__(self, env, deployment: Deployment, subs: list[SimSubserver], cost, metrics, done) -> None:
        self.env, self.dep, self.subs, self.cost, self.metrics, self.done = env, deployment, subs, cost, metrics, done
        self._free: dict[tuple[int, int], float] = {}  # link -> when its last message lands

    def dispatch(self, src: int, actions: list[Action]) -> None:
        env = self.env
        for a in actions:
            if isinstance(a, Send):
                link = (a.msg.src, a.msg.dst)
                at = max(env.now + self.cost.message_ms(a.msg.nbytes) / 1000.0, self._free.get(link, 0.0))
                self._free[link] = at
                if at > env.now:
                    env.process(self._later(a.msg, at - env.now))
                else:
                    self.deliver(a.msg)
            elif isinstance(a, Emit):
                self.metrics.on_tokens(a.rid, len(a.tokens), env.now, a.model)
            elif isinstance(a, Finish):
                self.metrics.on_finish(a.rid, env.now, a.num_hops)
                ev = self.done.pop(a.rid, None)
                if ev is not None:
                    ev.succeed()
        for j in self.dep.wakes(src):
            self.subs[j].kick()

    def deliver(self, msg: PeerMsg) -> None:
        dst = self.subs[msg.dst]
        if self.dep.std_serving and isinstance(msg, PeerReq) and not msg.finished and msg.rid in dst.sched.reqs:
            dst.rematch.add(msg.rid)  # standard serving: a returning hop is a new request that re-matches
        self.dispatch(msg.dst, self.dep.deliver(msg, self.env.now))

    def _later(self, msg: PeerMsg, delay_s: float):
        yield self.env.timeout(delay_s)
        self.deliver(msg)


def _has_arrivals(specs: list[RequestSpec]) -> bool:
    return any(s.arrival is not None for s in specs)
