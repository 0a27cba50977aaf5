"""Autotune's solve: the decider (`sim.decide`) on what serving measured, in the simulator and live alike: the
controller's estimates become a simulator config (docs/autotune.md#the-solve). Live, the solve runs in a process of
its own (`OffloadedSolve`): a simulation would hold the GIL the front-end's event loop needs.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenrouter.calibration.cost import ConstantCost, Interference, ModelStepCost, StepCost
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.core.autotune import AutotuneController, Solution
from tokenrouter.core.autotune_counters import batch_bucket
from tokenrouter.core.autotune_estimate import Estimates
from tokenrouter.core.config import AutotuneConfig, DeploymentConfig, RouterConfig
from tokenrouter.core.hop_law import ONE_TOKEN_HANDBACK
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import Policy, clamp_thresholds
from tokenrouter.deploy.placement import colocated
from tokenrouter.markov import MarkovModel, evaluate_thresholds
from tokenrouter.markov.colocation import DELTA_MS, Load, peer_load, tokens_per_row
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.routers.presets import router_law
from tokenrouter.sim.decide import Objective, decide, trial_config, trial_requests
from tokenrouter.sim.loop import SimConfig, cost_model, simulate_config
from tokenrouter.sim.propose import routing_matrices

PROMPT_TOKENS = 128  # prompt length of the solve's trials
ASSUMED_MEAN_OUTPUT = 840  # the trials' mean output before any request finished (the low-effort workload's)
ASSUMED_OUTPUT_SIGMA = 0.6  # their lognormal spread before two requests finished (the synthetic workloads')
MIN_REPLAYED_OUTPUTS = 16  # finished requests from which the trials replay the measured lengths


@dataclass(slots=True)
class MeasuredModelCost:
    """One model's step time from a measured function of the batch's rows; host time as the profile prices it (the
    measured busy time, launch to end, does not hold it)."""

    name: str
    alone_ms: Callable[[int], float]
    host: Callable[[int], float]
    router_ms: float = 0.0
    sched_ms: float = 0.0

    def step_ms(self, stats: StepStats) -> float:
        return self.alone_ms(stats.rows) if stats.rows else 0.0

    def host_ms(self, rows: int) -> float:
        return self.host(rows)

    def router_step_ms(self, rows: int) -> float:
        return 0.0  # the measured steps hold the router's device part


class _OverBase(StepCost):
    """`base` (the deployment's cost model) with each model's step costs replaced (`models`): links, co-location
    factors, the prepare margin and the sync coordinator stay the profile's."""

    base: StepCost
    models: Sequence[ModelStepCost]

    def for_model(self, model: int | str) -> ModelStepCost:
        if isinstance(model, int):
            return self.models[model]
        return next(m for m in self.models if m.name == model)

    def message_ms(self, nbytes: int = 0) -> float:
        return self.base.message_ms(nbytes)

    def router_ms(self, model: int | str | None = None) -> float:
        return self.base.router_ms(model)

    def sched_ms(self, model: int | str | None = None) -> float:
        return self.base.sched_ms(model)

    def interference(self, model: int, peer: int) -> Interference:
        return self.base.interference(model, peer)

    def overlap_frac(self, model: int | str) -> float:
        return self.base.overlap_frac(model)

    def prepare_margin_ms(self) -> float | None:
        return self.base.prepare_margin_ms()

    def gate_ms_per_step(self, policy: str) -> float:
        return self.base.gate_ms_per_step(policy)


class MeasuredCost(_OverBase):
    """Each model's step time `alone_ms[i](rows)`, as measured; the rest `base`'s (`_OverBase`)."""

    def __init__(self, base: StepCost, names: Sequence[str], alone_ms: Sequence[Callable[[int], float]]) -> None:
        self.base = base
        self.models = [MeasuredModelCost(n, f, base.for_model(i).host_ms) for i, (n, f) in
                       enumerate(zip(names, alone_ms, strict=True))]  # fmt: skip

    def router_ms(self, model: int | str | None = None) -> float:
        return 0.0  # in the measured steps

    def overlap_frac(self, model: int | str) -> float:
        return 0.0  # what the loop adds under overlap is in the measured busy time


@dataclass(slots=True)
class ScaledModelCost:
    """The profile's prices of one model's step, times `level` (what serving measured over what the profile says)."""

    base: ModelStepCost
    level: float

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def router_ms(self) -> float:
        return self.base.router_ms

    @property
    def sched_ms(self) -> float:
        return self.base.sched_ms

    def step_ms(self, stats: StepStats) -> float:
        return self.level * self.base.step_ms(stats)

    def host_ms(self, rows: int) -> float:
        return self.base.host_ms(rows)

    def router_step_ms(self, rows: int) -> float:
        return self.level * self.base.router_step_ms(rows)


class ScaledCost(_OverBase):
    """Each model's step costs scaled by `levels[i]`; the rest `base`'s (`_OverBase`)."""

    def __init__(self, base: StepCost, levels: Sequence[float]) -> None:
        self.base = base
        self.models = [ScaledModelCost(base.for_model(i), k) for i, k in enumerate(levels)]


def solve_requests(concurrency: int) -> int:
    """Requests of a solve's judging trial: twice `trial_requests`. B within 1-2% of each other swap places on a
    three-generation trial (at hop 0.1, N = 8: (2,7) a hair above (3,6) on 24 requests, 1.4% below on 48)."""
    return 2 * trial_requests(concurrency)


LEVEL_RANGE = (0.25, 4.0)  # a measured level (over the profile's) is clamped to this: another machine or model


@dataclass(slots=True)
class SimulatedSolve:
    """`core.autotune.Solve` by the decider. `base`: the deployment's cost model; `priced`: whether `base` prices the
    models' steps (else only the measured lines are used); `budget_s`: the search's time budget per solve."""

    deployment: DeploymentConfig
    base: StepCost
    objective: Objective = dataclasses.field(default_factory=Objective)
    budget_s: float = 4.0
    max_states: int = 50_000  # the Markov chain that measures the B in force's co-location load
    priced: bool = True

    def __call__(self, est: Estimates, current: tuple[int, ...]) -> Solution:
        n = est.concurrency
        with tempfile.TemporaryDirectory(prefix="autotune-") as tmp:
            cfg = self.trial_config(est, current, Path(tmp))
            cur = clamp_thresholds(current, n)
            choice = decide(cfg, n, self.objective, budget_s=self.budget_s, also=(cur,), finals=2,
                            requests=solve_requests(n))  # fmt: skip
        best = choice.thresholds
        if best is None:  # nothing meets the SLO: keep the B in force (the controller changes nothing)
            return Solution(cur, None, None, choice.describe())
        now = choice.trials.get(cur)
        return Solution(best, choice.trials[best].tok_s, None if now is None else now.tok_s,
                        f"simulated {len(choice.scouted)} B at the measured step times")  # fmt: skip

    def trial_config(self, est: Estimates, current: tuple[int, ...], folder: Path | None = None) -> SimConfig:
        """The estimates as a simulator config. With `folder` and enough requests finished, the trials replay the
        recent output lengths (a JSONL written there); else `mean:P,O,SIGMA` of their moments."""
        n = est.concurrency
        dep = dataclasses.replace(self.deployment, router=_estimated_router(self.deployment, est))
        if folder is not None and len(est.outputs) >= MIN_REPLAYED_OUTPUTS:
            workload = str(_replay_file(folder, est.outputs, solve_requests(n)))
        else:
            mean = max(1, round(est.mean_output or ASSUMED_MEAN_OUTPUT))
            sigma = ASSUMED_OUTPUT_SIGMA if est.output_sigma is None else est.output_sigma
            workload = f"mean:{PROMPT_TOKENS},{mean},{sigma:.3g}"
        cfg = SimConfig(dep, workload=workload, concurrency=n, cost=self.base)
        cur = clamp_thresholds(current, n)
        if self.priced:
            return dataclasses.replace(cfg, cost=ScaledCost(self.base, self._levels(cfg, est, cur)))
        alone = self._alone(cfg, est.step_table(n), self._load(cfg, est, cur))
        names = [m.name for m in dep.models]
        return dataclasses.replace(cfg, cost=MeasuredCost(self.base, names, [_table_fn(t) for t in alone]))

    def _load(self, cfg: SimConfig, est: Estimates, current: tuple[int, ...]) -> Load | None:
        """The co-location load of the B in force (each model's peer's busy fraction and pass size) from the Markov
        chain at that B on the measured step times; None without MPS or when the chain does not fit."""
        m = len(cfg.deployment.models)
        if m != 2 or est.concurrency < 2 or not any(colocated(cfg.deployment, i) for i in range(m)):
            return None
        P, C = routing_matrices(cfg)
        try:
            chain = MarkovModel.create(est.step_table(), P, C, est.concurrency, DELTA_MS, est.mean_output)
            return peer_load(evaluate_thresholds(chain, current, self.max_states)[0], tokens_per_row(P))
        except (StateSpaceTooLarge, ValueError):
            return None

    def _levels(self, cfg: SimConfig, est: Estimates, current: tuple[int, ...]) -> list[float]:
        """Per model: measured step time over the simulator's at the B in force, bucket by batch size (weighted by
        the measured steps): both under that B's co-location, like with like (docs/autotune.md#the-solve)."""
        tc = trial_config(cfg, est.concurrency, solve_requests(est.concurrency))
        policy = tc.deployment.policy.with_thresholds(current)
        sim = simulate_config(dataclasses.replace(tc, deployment=dataclasses.replace(tc.deployment, policy=policy)))
        levels = []
        for i, pts in enumerate(est.step_points or [()] * len(cfg.deployment.models)):
            own = _bucket_means(*sim.metrics.batch_series(i))
            pairs = [(w, ms, own[batch_bucket(round(r))]) for r, ms, w in pts if batch_bucket(round(r)) in own]
            num, den = sum(w * ms for w, ms, _ in pairs), sum(w * s for w, _, s in pairs)
            k = num / den if den > 0 else 1.0
            levels.append(min(LEVEL_RANGE[1], max(LEVEL_RANGE[0], k)))
        return levels

    def _alone(self, cfg: SimConfig, measured: list[list[float]], load: Load | None) -> list[list[float]]:
        """The measured step tables with the B in force's co-location divided out (unchanged without it)."""
        if load is None:
            return measured
        tpr = tokens_per_row(routing_matrices(cfg)[0])
        out = []
        for i, row in enumerate(measured):
            peers = colocated(cfg.deployment, i)
            if not peers:
                out.append(row)
                continue
            inter = self.base.interference(i, peers[0])
            u, peer_tokens = load[i]
            out.append([row[b - 1] / inter.mixed(max(1, round(b * tpr[i])), u, peer_tokens) for b in
                        range(1, len(row) + 1)])  # fmt: skip
        return out


def _bucket_means(start: np.ndarray, end: np.ndarray, size: np.ndarray) -> dict[int, float]:
    """Mean own busy time (ms) of a run's steps per batch-size bucket, as a subserver counts it (`BatchTimes`): from
    the step's start, or the end of the step before it if later, to its end."""
    sums: dict[int, list[float]] = {}
    prev = float("-inf")
    for a, b, rows in zip(start.tolist(), end.tolist(), size.tolist(), strict=True):
        sums.setdefault(batch_bucket(rows), []).append((b - max(a, prev)) * 1000.0)
        prev = b
    return {k: sum(v) / len(v) for k, v in sums.items()}


def _replay_file(folder: Path, outputs: Sequence[int], requests: int) -> Path:
    """A request JSONL of `requests` lines: prompts of PROMPT_TOKENS, outputs the measured lengths in the order they
    finished, cycled when there are fewer."""
    path = folder / "outputs.jsonl"
    lines = (json.dumps({"prompt_len": PROMPT_TOKENS, "output_len": int(outputs[k % len(outputs)])})
             for k in range(max(requests, len(outputs))))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _table_fn(table: list[float]) -> Callable[[int], float]:
    """L(rows) from a table for rows 1..N; beyond it, the last two points' line (never below the last value)."""
    n = len(table)

    def f(rows: int) -> float:
        if rows <= n:
            return table[max(1, rows) - 1]
        slope = table[-1] - table[-2] if n > 1 else 0.0
        return table[-1] + max(0.0, slope) * (rows - n)

    return f


def _estimated_router(dep: DeploymentConfig, est: Estimates) -> RouterConfig:
    """The deployment's router with its synthetic probabilities as serving measured them (a learned router: the
    synthetic law of its measured rates)."""
    rc = dep.router
    p = est.hop_prob[0]
    q = est.hop_prob[1] if len(est.hop_prob) > 1 else None
    name = RouterName(str(rc.name))
    if name is RouterName.ME or name is RouterName.TRACE:
        return rc
    changes: dict = {"weights": None}
    if p is not None:
        changes["hop_rate"] = min(1.0, max(0.0, p))
    if name is RouterName.MARKOV:
        # its law from the measured rates: mean runs 1/p on the small model, 1/q on the large one
        law = router_law(rc, 2)
        p_now = p if p is not None else law.routing[0][1]
        q_now = q if q is not None else law.routing[1][0]
        return dataclasses.replace(rc, name=RouterName.R_STITCH, hop_rate=max(1e-6, p_now),
                                   return_prob=max(1e-6, q_now), mean_small_run=None, mean_large_run=None)  # fmt: skip
    if name not in ONE_TOKEN_HANDBACK and q is not None:
        changes["return_prob"] = min(1.0, max(1e-6, q))
    return dataclasses.replace(rc, **changes)


def make_controller(dep: DeploymentConfig, config: AutotuneConfig | None = None, policy: Policy | None = None,
                    cost: StepCost | None = None, *, offload: bool = False) -> AutotuneController:  # fmt: skip
    """The controller of a deployment: its `policy.autotune` settings (or `config`), its policy in force (or
    `policy`), and `SimulatedSolve` priced by `cost` (default: the profile's). `offload`: each solve in a process
    of its own (the runtime's front-end)."""
    cfg = config or dep.policy.autotune or AutotuneConfig()
    law = router_law(dep.router, len(dep.models))
    objective = Objective(cfg.slo_tpot_ms)
    args = (objective, cfg.search_s, cfg.max_states)
    solve: Callable[[Estimates, tuple[int, ...]], Solution] = (
        OffloadedSolve(dep, *args) if offload else solver_for(dep, cost, *args)
    )
    return AutotuneController(cfg, policy or dep.policy.build(), solve, law.drops_token)


def solver_for(dep: DeploymentConfig, cost: StepCost | None, objective: Objective, budget_s: float,
               max_states: int) -> SimulatedSolve:  # fmt: skip
    """The solve of a deployment: priced by `cost`, else by its profile; a profile that cannot price the pair (the
    tiny CPU models) leaves the measured lines alone, with free links and no co-location."""
    if cost is not None:
        return SimulatedSolve(dep, cost, objective, budget_s, max_states)
    try:
        return SimulatedSolve(dep, cost_model(dep, load_profile(dep.profile)), objective, budget_s, max_states)
    except ValueError:  # ProfileError: not a pair the profile measured
        bare = ConstantCost([1.0] * len(dep.models))
        return SimulatedSolve(dep, bare, objective, budget_s, max_states, priced=False)


class OffloadedSolve:
    """`SimulatedSolve` in a process of its own, started on first use; it builds its cost model once."""

    def __init__(self, dep: DeploymentConfig, objective: Objective, budget_s: float, max_states: int) -> None:
        self.args = (dep, objective, budget_s, max_states)
        self._pool: ProcessPoolExecutor | None = None

    def __call__(self, est: Estimates, current: tuple[int, ...]) -> Solution:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_start_solver,
                                             initargs=self.args)  # fmt: skip
        return self._pool.submit(_solve_there, est, current).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_SOLVER: list[SimulatedSolve] = []  # the solver of this worker process (`OffloadedSolve`'s, one per process)


def _start_solver(dep: DeploymentConfig, objective: Objective, budget_s: float, max_states: int) -> None:
    _SOLVER.append(solver_for(dep, None, objective, budget_s, max_states))


def _solve_there(est: Estimates, current: tuple[int, ...]) -> Solution:
    return _SOLVER[0](est, current)
