"""One simulated run (`simulate_config`): the deployment `tr serve` would build, in a simpy environment, driven by
a workload; only time is simulated (docs/simulator.md). `sim.run.run_sim` is the entry point (it adds autotune's
controller); the decider's trials come here directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec
import simpy

from tokenrouter.calibration.cost import CostModel, StepCost
from tokenrouter.calibration.profile import LinkInfo, Profile, ProfileError
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.messages import Action, Emit, Finish, PeerMsg, PeerReq, Send
from tokenrouter.core.names import RouterName
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.deploy import Deployment, build_deployment
from tokenrouter.deploy.placement import colocated, gpus_used
from tokenrouter.metrics import MetricsCollector
from tokenrouter.models import load_spec
from tokenrouter.routers.trace_law import replayed_runs
from tokenrouter.sim.clients import ClosedLoop, OpenLoop
from tokenrouter.sim.drivers import FinishCounter, PhaseDriver, SimAutotune
from tokenrouter.sim.gpu_share import SharedGpu
from tokenrouter.sim.subserver import SimSubserver
from tokenrouter.workloads import (
    Phase,
    RequestSpec,
    initial_phase,
    load_phases,
    make_workload,
    request_ids,
    request_seed,
)

if TYPE_CHECKING:
    from tokenrouter.core.autotune import AutotuneController


@dataclass(slots=True)
class SimConfig:
    deployment: DeploymentConfig
    workload: str = "low-effort"
    num_requests: int = 64
    concurrency: int = 8
    arrival_rate: float | None = None  # requests/s: open loop; None: closed loop with `concurrency` clients
    seed: int = 0
    max_output: int | None = None
    cost: StepCost | None = None  # instead of the profile's (tests use ConstantCost)
    # A trial (the decider's): stop when the closed loop runs out of requests; only the steady window is measured
    trial: bool = False
    # The workload's phases, parsed when the config is made (None: not yet); a copy (`dataclasses.replace`) keeps them
    phases: tuple[Phase, ...] | None = None
    # Keep every step's record (`tokenrouter.steplog`): SimResult.extra["step_logs"], per model
    step_logs: bool = False

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.arrival_rate is not None and self.arrival_rate <= 0:
            raise ValueError(f"arrival rate must be > 0, got {self.arrival_rate}")
        if self.phases is None:
            self.phases = tuple(load_phases(self.workload))
            self._start_at(initial_phase(list(self.phases)))

    def _start_at(self, first: Phase | None) -> None:
        """A phase at 0 s replaces the run's N and hop rate from the start: the one place it is applied, so the
        decider chooses B for what the run starts with, and a copy of the config (a trial) does not apply it again."""
        if first is not None and first.concurrency is not None:
            self.concurrency = first.concurrency
        if first is not None and first.hop_rate is not None:
            self.deployment = replace(self.deployment, router=replace(self.deployment.router, hop_rate=first.hop_rate))


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


def prepare_sim(cfg: SimConfig) -> tuple[Profile, StepCost, list[RequestSpec], Deployment]:
    """What a run is built from: the profile, the step cost, the requests and the deployment. Every user error a
    run can raise is raised here, before any simulated time, so callers can check a whole grid first."""
    dep = cfg.deployment
    profile = load_profile(dep.profile)
    cost = cfg.cost if cfg.cost is not None else cost_model(dep, profile)
    specs = make_workload(
        cfg.workload, cfg.num_requests, cfg.seed, arrival_rate=cfg.arrival_rate, max_output=cfg.max_output
    )
    traces = {s.rid: s.runs or [] for s in specs} if any(s.runs for s in specs) else None
    if dep.router.name == RouterName.TRACE:
        traces = replayed_runs(dep.router, specs)  # one line when it would replay nothing
    deployment = build_deployment(dep, gpu_memory_gb=profile.gpu.memory_gb, seed=cfg.seed, traces=traces)
    return profile, cost, specs, deployment


ControllerFactory = Callable[..., "AutotuneController"]
"""`(deployment, policy=..., cost=...) -> AutotuneController` (`sim.autotune_solve.make_controller`)."""


def simulate_config(cfg: SimConfig, make_controller: ControllerFactory | None = None) -> SimResult:
    """Run `cfg`; with `policy.autotune`, `make_controller` builds the controller (required then)."""
    t_wall = time.perf_counter()
    dep = cfg.deployment
    profile, cost, specs, deployment = prepare_sim(cfg)
    analytic = cfg.cost is None and profile.kind == "analytic"
    run = _wire_up(deployment, cost, dep.policy.kind)
    for s in run.subs if cfg.step_logs else ():
        s.step_log = []
    phases = list(cfg.phases or ())
    first, n0 = initial_phase(phases), cfg.concurrency  # the phase at 0 s is in `cfg` already
    loader = _loader(run, cfg, specs, n0, deployment)
    driver = PhaseDriver(run.env, phases, loader, run.subs, dep.router) if phases else None
    tuner, initial = _autotune(run, dep, deployment, cost, loader, n0, make_controller)
    stop_early = cfg.trial and isinstance(loader, ClosedLoop) and not phases and tuner is None
    run.env.run(until=loader.exhausted if stop_early else None)
    if run.done and not stop_early:
        raise RuntimeError(f"simulation stalled with {len(run.done)} requests unfinished (scheduler deadlock?)")
    window = None
    if isinstance(loader, ClosedLoop) and loader.exhausted_at and loader.exhausted_at > 0:
        window = (0.0, loader.exhausted_at)
    summary = run.metrics.summary(window=window)
    summary.update(per_gpu(summary, gpus_used(dep)))
    n_end = next((p.concurrency for p in reversed(phases) if p.concurrency is not None), n0)
    extra = _extra(cost, first, driver, tuner, initial)
    subs = run.subs
    if cfg.step_logs:
        extra["step_logs"] = {i: s.step_log for i, s in enumerate(subs)}
    return SimResult(summary=summary, metrics=run.metrics, config=cfg,
                     thresholds=deployment.entry.policy.thresholds_for(n_end, deployment.num_models), analytic=analytic,
                     window=window, kv_tokens=deployment.kv_tokens, wall_s=time.perf_counter() - t_wall,
                     preemptions=sum(s.sched.num_preemptions for s in subs),
                     wasted_rows=sum(s.wasted_rows for s in subs), rematch_rows=sum(s.rematch_rows for s in subs),
                     extra=extra)  # fmt: skip


@dataclass(slots=True)
class _Wired:
    """One run's subservers, the links between them and the requests in flight (`done`: rid -> its client's event)."""

    env: simpy.Environment
    metrics: MetricsCollector
    subs: list[SimSubserver]
    wire: _Links
    done: dict[str, simpy.Event]
    finishes: FinishCounter


def _wire_up(deployment: Deployment, cost: StepCost, policy: str) -> _Wired:
    """A fresh environment with one subserver per model, their actions dispatched over the link model."""
    env = simpy.Environment()
    metrics = MetricsCollector(deployment.num_models)
    subs = subservers(env, deployment, cost, metrics, policy)
    done: dict[str, simpy.Event] = {}
    finishes = FinishCounter()
    wire = _Links(env, deployment, subs, cost, metrics, done, finishes)
    for s in subs:
        s.dispatch = wire.dispatch
    return _Wired(env, metrics, subs, wire, done, finishes)


def _loader(run: _Wired, cfg: SimConfig, specs: list[RequestSpec], n0: int,
            deployment: Deployment) -> OpenLoop | ClosedLoop:  # fmt: skip
    """The clients: an open loop when the run has an arrival rate or the workload timed arrivals, else `n0`
    closed-loop clients; each request enters at the entry model as `tr bench` sends it."""
    dep = cfg.deployment
    entry = run.subs[dep.entry]

    def submit(spec: RequestSpec) -> simpy.Event:
        ids = request_ids(spec, cfg.seed)  # what `tr bench` sends, with its seed: the live server's hops
        req = Request(
            spec.rid,
            ids,
            len(ids),
            SamplingParams(max_tokens=spec.output_len, ignore_eos=True, seed=request_seed(spec, cfg.seed)),
            num_models=deployment.num_models,
            entry=dep.entry,
        )
        ev = run.env.event()
        run.done[spec.rid] = ev
        run.metrics.on_arrival(spec.rid, run.env.now, len(ids))
        run.wire.dispatch(dep.entry, entry.sched.add(req, run.env.now))
        return ev

    if cfg.arrival_rate is not None or any(s.arrival is not None for s in specs):
        return OpenLoop(run.env, specs, submit)
    return ClosedLoop(run.env, specs, n0, submit)


def _autotune(run: _Wired, dep: DeploymentConfig, deployment: Deployment, cost: StepCost,
              loader: OpenLoop | ClosedLoop, n0: int, make_controller: ControllerFactory | None,
              ) -> tuple[SimAutotune | None, tuple[int, ...] | None]:  # fmt: skip
    """With `policy.autotune`: the controller on the simulated counters, priced by the simulator's own step cost,
    and the B it starts from at `n0`; (None, None) without."""
    if dep.policy.autotune is None:
        return None, None
    if make_controller is None:
        raise ValueError("a run with policy.autotune needs its controller: run it with sim.run.run_sim")
    controller = make_controller(dep, policy=deployment.entry.policy, cost=cost)  # the sim's own step prices
    pending = (lambda: not loader.done) if isinstance(loader, OpenLoop) else (lambda: False)
    tuner = SimAutotune(run.env, controller, dep.policy, run.subs, run.finishes,
                        lambda: loader.done and not run.done, pending)  # fmt: skip
    return tuner, controller.current(n0)


def _extra(cost: StepCost, first: Phase | None, driver: PhaseDriver | None, tuner: SimAutotune | None,
           initial: tuple[int, ...] | None) -> dict[str, Any]:  # fmt: skip
    """SimResult.extra: what was estimated, the phases applied and autotune's record, each only when the run had it."""
    extra: dict[str, Any] = {}
    if cost.notes():
        extra["estimated"] = cost.notes()
    if driver is not None:
        applied = ([(0.0, first)] if first else []) + driver.applied
        extra["phases"] = [(t, p.hop_rate, p.concurrency) for t, p in applied]
    if tuner is not None:
        extra["autotune"] = {
            "initial": list(initial or ()),
            "changes": [d.as_dict() for d in tuner.timeline],
            "solves": tuner.controller.solves,
            "status": tuner.controller.status,
            "notices": list(tuner.controller.notices),
        }
    return extra


def subservers(env: simpy.Environment, deployment: Deployment, cost: StepCost, metrics: MetricsCollector,
               policy: str) -> list[SimSubserver]:  # fmt: skip
    """One simulated subserver per model, priced by `cost` (co-located models share a `SharedGpu`)."""
    gpus = shared_gpus(deployment, cost)
    margin = cost.prepare_margin_ms()
    gate_ms = cost.gate_ms_per_step(policy) if deployment.gate is not None else 0.0
    subs = []
    for i, sched in enumerate(deployment.schedulers):
        mc = cost.for_model(i)
        subs.append(SimSubserver(env, sched, cost=mc, rule=deployment.graph_rules[i], metrics=metrics, gpu=gpus[i],
                                 host_ms=mc.host_ms, device_ms=mc.router_step_ms, gate_ms=gate_ms,
                                 overlap_frac=cost.overlap_frac(i), prepare_margin_ms=margin))  # fmt: skip
    return subs


def cost_model(dep: DeploymentConfig, profile: Profile) -> CostModel:
    """The deployment's cost model (placement, models, tp, SM shares, each model's own profile, a learned router);
    the config's `placement.link_latency_ms` / `link_bandwidth_gbps`, when set, replace the profile's link."""
    pl = dep.placement
    if pl.link_latency_ms is not None or pl.link_bandwidth_gbps is not None:
        old = profile.link
        latency = old.latency_ms if pl.link_latency_ms is None else pl.link_latency_ms
        bandwidth = old.bandwidth_gbps if pl.link_bandwidth_gbps is None else pl.link_bandwidth_gbps
        link = LinkInfo(latency_ms=latency, bandwidth_gbps=bandwidth)
        profile = msgspec.structs.replace(profile, link=link)
    names = [m.name for m in dep.models]
    for m in dep.models:
        try:
            profile.resolve_name(m.name)
        except ProfileError:
            load_spec(m.path or m.name)  # a typo is an unknown model (with the closest name), not the profile's gap
            raise
    shares = [m.mps_active_thread_percentage for m in dep.models]
    learned = dep.router.name if dep.router.weights else None
    own = [None if m.profile is None else load_profile(m.profile) for m in dep.models]
    return CostModel(profile, dep.placement.mode, models=names, shares=shares, learned_router=learned,
                     tp=[m.tp for m in dep.models], profiles=own)  # fmt: skip


def estimated_notes(dep: DeploymentConfig) -> list[str]:
    """What a simulation of `dep` prices without a measurement, one line each (empty: all measured)."""
    cost = cost_model(dep, load_profile(dep.profile))
    for i in range(len(dep.models)):
        for j in colocated(dep, i):
            cost.interference(i, j)
    return cost.notes()


def per_gpu(summary: dict[str, float], gpus: int) -> dict[str, float]:
    """GPUs the deployment occupies and its throughputs per GPU (a model at tp = k counts k GPUs)."""
    out = {"gpus_used": float(gpus)}
    for key in ("output_throughput_tok_s", "steady_output_throughput_tok_s"):
        if key in summary:
            out[key.replace("_tok_s", "_per_gpu_tok_s")] = summary[key] / gpus
    return out


def shared_gpus(deployment: Deployment, cost: StepCost) -> list[SharedGpu]:
    """One `SharedGpu` per group of co-located models (MPS on one GPU), one each otherwise; index = model."""
    m = deployment.num_models
    group = list(range(m))
    for i in range(m):
        for j in deployment.colocated(i):
            gi, gj = group[i], group[j]
            group = [gi if g == gj else g for g in group]
    peers = [deployment.colocated(i) for i in range(m)]
    factors = {(i, j): cost.interference(i, j) for i in range(m) for j in peers[i]}
    # Lookups are pure functions of integer token counts that recur every step: remember them.
    seen_factor: dict[tuple[int, int, int, int], float] = {}
    seen_cap: dict[tuple[int, int], float] = {}

    def factor(model: int, own: int, peer: int, peer_tokens: int) -> float:
        key = (model, own, peer, peer_tokens)
        if key not in seen_factor:
            f = factors.get((model, peer))
            seen_factor[key] = 1.0 if f is None else f.factor(own, peer_tokens)
        return seen_factor[key]

    def cap(model: int, own: int) -> float:
        if (model, own) not in seen_cap:
            seen_cap[model, own] = factors[(model, peers[model][0])].cap(own) if peers[model] else 1.0
        return seen_cap[model, own]

    by_group: dict[int, SharedGpu] = {}
    return [by_group.setdefault(g, SharedGpu(factor, cap)) for g in group]


class _Links:
    """Carries actions: peer messages over the link model (order kept per link), tokens and finishes to the
    metrics and the clients, and wakes the subservers the deployment says to."""

    def __init__(self, env, deployment: Deployment, subs: list[SimSubserver], cost, metrics, done,
                 finishes: FinishCounter | None = None) -> None:  # fmt: skip
        self.env, self.dep, self.subs, self.cost, self.metrics, self.done = env, deployment, subs, cost, metrics, done
        self.finishes = finishes or FinishCounter()
        self._free: dict[tuple[int, int], float] = {}  # link -> when its last message lands

    def dispatch(self, src: int, actions: list[Action]) -> None:
        env = self.env
        for a in actions:
            kind = type(a)
            if kind is Send:
                if isinstance(a.msg, PeerReq) and not a.msg.finished:
                    self.subs[a.msg.src].hops += 1  # what a runtime subserver counts as a hop
                link = (a.msg.src, a.msg.dst)
                at = max(env.now + self.cost.message_ms(a.msg.nbytes) / 1000.0, self._free.get(link, 0.0))
                self._free[link] = at
                if at > env.now:
                    env.timeout(at - env.now, a.msg).callbacks.append(self._landed)
                else:
                    self.deliver(a.msg)
            elif kind is Emit:
                self.subs[a.model].tokens += len(a.tokens)
                self.metrics.on_tokens(a.rid, len(a.tokens), env.now, a.model)
            elif kind is Finish:
                self.finishes.on_finish(a.num_output)
                self.metrics.on_finish(a.rid, env.now, a.num_hops)
                ev = self.done.pop(a.rid, None)
                if ev is not None:
                    ev.succeed()
        for j in self.dep.wakes(src):
            self.subs[j].kick()

    def deliver(self, msg: PeerMsg) -> None:
        dst = self.subs[msg.dst]
        if self.dep.std_serving and isinstance(msg, PeerReq) and not msg.finished and msg.rid in dst.sched.reqs:
            # Standard serving: a returning hop is a new request that re-matches its prefix in whole cached pages
            # and re-prefills the rest (the part of its last page too), as the baseline's prefix cache does.
            dst.rematch.add(msg.rid)
            req = dst.sched.reqs[msg.rid]
            req.num_computed -= req.num_computed % dst.sched.kv.page_size
        self.dispatch(msg.dst, self.dep.deliver(msg, self.env.now))

    def _landed(self, event: simpy.Event) -> None:
        self.deliver(event.value)
