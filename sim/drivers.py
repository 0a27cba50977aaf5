"""The simulator's drivers of a shifting workload (`PhaseDriver`: client count and hop rate at each workload phase)
and of autotune (`SimAutotune`: the runtime's controller on the simulated counters, docs/autotune.md): simpy
processes beside the subservers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from tokenrouter.core.autotune import AutotuneController, Decision
from tokenrouter.core.autotune_counters import RECENT_OUTPUTS, CounterSnapshot, ModelCounters
from tokenrouter.routers.presets import set_hop_rate
from tokenrouter.workloads import Phase

if TYPE_CHECKING:
    from tokenrouter.core.config import PolicyConfig, RouterConfig
    from tokenrouter.sim.subserver import SimSubserver


class FinishCounter:
    """Requests finished and their output tokens (the runtime's front-end counts the same from `Finished`)."""

    def __init__(self) -> None:
        self.finished = 0
        self.tokens = 0
        self.tokens_sq = 0
        self.recent: deque[int] = deque(maxlen=RECENT_OUTPUTS)

    def on_finish(self, num_output: int) -> None:
        self.finished += 1
        self.tokens += num_output
        self.tokens_sq += num_output**2
        self.recent.append(num_output)


class PhaseDriver:
    """Applies `phases` with at_s > 0 at their times (a phase at 0 is the run's starting point: the caller starts
    with it). `loader` must have `set_concurrency` when a phase sets one (the closed loop)."""

    def __init__(self, env: simpy.Environment, phases: list[Phase], loader, subs: list[SimSubserver],
                 router: RouterConfig) -> None:  # fmt: skip
        self.env, self.loader, self.subs, self.router = env, loader, subs, router
        self.applied: list[tuple[float, Phase]] = []
        later = [p for p in phases if p.at_s > 0]
        if any(p.concurrency is not None for p in phases) and not hasattr(loader, "set_concurrency"):
            raise ValueError("workload phases that set 'concurrency' need a closed loop (no --arrival-rate or "
                             "arrival times)")  # fmt: skip
        if any(p.hop_rate is not None for p in phases):
            self.set_hop_rate(router.hop_rate)  # fails now, not mid-run, for a router without one
        self.proc = env.process(self._run(later))

    def set_hop_rate(self, hop_rate: float) -> None:
        """Every subserver's router to `hop_rate` (ValueError for a router without a synthetic rate)."""
        for s in self.subs:
            set_hop_rate(s.sched.router, self.router.name, hop_rate, self.router.return_prob)

    def _run(self, phases: list[Phase]):
        for ph in phases:
            yield self.env.timeout(ph.at_s - self.env.now)
            if ph.hop_rate is not None:
                self.set_hop_rate(ph.hop_rate)
            if ph.concurrency is not None:
                self.loader.set_concurrency(ph.concurrency)
            self.applied.append((self.env.now, ph))


STALL_OBSERVES = 600  # unchanged snapshots in a row (10 simulated minutes at 1 s) after which the tuner stops


class SimAutotune:
    """Runs `controller` on the simulated counters until `finished()`, starting from `policy` (the deployment's);
    `timeline`: every decision applied, in order. After STALL_OBSERVES unchanged snapshots with no arrival to come
    it stops, so a stalled simulation ends and reports the stall as it does without autotune."""

    def __init__(self, env: simpy.Environment, controller: AutotuneController, policy: PolicyConfig,
                 subs: list[SimSubserver], finishes: FinishCounter, finished: Callable[[], bool],
                 arrivals_pending: Callable[[], bool] = lambda: False) -> None:  # fmt: skip
        self.env, self.controller, self.subs, self.finishes, self.finished = env, controller, subs, finishes, finished
        self.policy = policy
        self.arrivals_pending = arrivals_pending
        self.entry = next(s for s in subs if s.sched.is_entry)
        self.timeline: list[Decision] = []
        self.proc = env.process(self._run())

    def snapshot(self) -> CounterSnapshot:
        models = tuple(ModelCounters.of(s.tokens, s.hops, s.batches) for s in self.subs)
        f = self.finishes
        return CounterSnapshot(models, self.entry.sched.active, f.finished, f.tokens, f.tokens_sq, tuple(f.recent))

    def _run(self):
        last, same = None, 0
        while True:
            yield self.env.timeout(self.controller.config.observe_s)
            if self.finished():
                return
            snap = self.snapshot()
            same = same + 1 if snap == last else 0
            last = snap
            if same >= STALL_OBSERVES and not self.arrivals_pending():
                return
            decision = self.controller.observe(snap, self.env.now)
            if decision is None:
                continue
            policy = self.policy.with_thresholds(decision.new).build()
            for s in self.subs:
                s.sched.set_policy(policy)
            self.controller.applied(decision, policy)
            self.timeline.append(decision)
            for s in self.subs:
                s.kick()  # a lower threshold may let a waiting model launch now
