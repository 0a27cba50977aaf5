"""Threshold tuning: the Markov model proposes B per concurrency, the simulator checks it.

The Markov model (tokenrouter/markov) assumes geometric hops and a step time that depends on batch size only;
here that L_i(b) comes from the deployment's cost model at the workload's mean context, so a prediction
is cheap. The simulator then runs the top candidates with the real length distributions, context growth,
prefills, message latency and MPS interference, and the measured best wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenrouter.calibration.cost import ModelStepCost
from tokenrouter.calibration.gpus import usd_per_mtok
from tokenrouter.calibration.profile import load_profile
from tokenrouter.calibration.step_stats import SHORT_ROW_TOKENS, PartStats, StepStats
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.names import Layout, TuneObjective
from tokenrouter.deploy.placement import colocated
from tokenrouter.markov import MarkovModel, ThroughputResult, evaluate_thresholds, search_thresholds
from tokenrouter.markov.colocation import (
    DELTA_MS,
    Load,
    large_batch_ladder,
    peer_load,
    solve_at_load,
    solve_candidates,
    tokens_per_row,
)
from tokenrouter.markov.presets import matrices
from tokenrouter.markov.search import SearchOutcome
from tokenrouter.routers.presets import router_law
from tokenrouter.sim.run import SimConfig, SimResult, cost_model, run_sim
from tokenrouter.workloads import make_workload

MAX_SEARCH_CONCURRENCY = 1024
"""Largest N the Markov model is solved at. Its state budget bounds each chain, not the search: the fallbacks
(coarser quanta, then the search at N/2, recursively) explore capped chains whose transitions and thresholds grow
with N, so the time grows about linearly in N: about 20 s at N = 1,000 on one core (two passes under MPS), over
2 minutes at N = 4,096, hours at N = 100,000. Past this N a command refuses at once instead."""


def check_search_concurrency(n: int, hint: str = "") -> None:
    """ValueError (a one-line user error on the command lines) when N is past `MAX_SEARCH_CONCURRENCY`."""
    if n > MAX_SEARCH_CONCURRENCY:
        raise ValueError(f"N = {n:,} is too large for the Markov model: it is solved at N <= "
                         f"{MAX_SEARCH_CONCURRENCY:,} (its time grows with N: minutes at a few thousand, hours "
                         f"beyond){hint}")  # fmt: skip


@dataclass(slots=True)
class Prediction:
    thresholds: tuple[int, ...]
    throughput: float  # tok/s, Markov model (nan when the search was too large to predict anything)
    ranked: list[tuple[tuple[int, ...], float]] = field(default_factory=list)
    note: str = ""  # what the Markov search reduced and why ("" when exact)


@dataclass(slots=True)
class TunePoint:
    concurrency: int
    prediction: Prediction
    simulated: dict[tuple[int, ...], float]  # thresholds -> steady throughput in the DES
    best: tuple[int, ...]
    tpot_ms: tuple[float, float] = (float("nan"), float("nan"))  # TPOT p50, p99 of the simulation at `best`

    @property
    def best_throughput(self) -> float:
        return self.simulated[self.best]


def routing_matrices(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    return matrices(router_law(cfg.deployment.router, len(cfg.deployment.models)))


def _workload_means(cfg: SimConfig) -> tuple[float, float]:
    """(mean context a row attends, mean output tokens) of the configured workload."""
    specs = make_workload(cfg.workload, min(cfg.num_requests, 256), cfg.seed, max_output=cfg.max_output)
    ctx = float(np.mean([s.prompt_len + s.output_len / 2 for s in specs]))
    return ctx, max(1.0, float(np.mean([s.output_len for s in specs])))


def markov_inputs(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """The routing and commit matrices and the mean output length the Markov model of `cfg` takes."""
    P, C = routing_matrices(cfg)
    return P, C, _workload_means(cfg)[1]


def step_time_fns(cfg: SimConfig, load: list[tuple[float, float]] | None = None) -> list[Callable[[int], float]]:
    """L_i(b) in ms, from the simulator's own cost model: b rows at the workload's mean context, rows of the
    hop pattern's mean length, split as the model's graph rule splits them (in expectation), plus the router's
    device part and (without overlap) the host time. `load[i]` = (fraction of time the co-located peer runs,
    tokens of its pass): model i's pass is slowed by the co-run factor that share of the time and by its SM-cap
    factor the rest (the simulator applies the same factors pass by pass)."""
    dep = cfg.deployment
    cost = cfg.cost if cfg.cost is not None else cost_model(dep, load_profile(dep.profile))
    ctx, _ = _workload_means(cfg)
    tpr = tokens_per_row(routing_matrices(cfg)[0])
    peers = [colocated(dep, i) for i in range(len(dep.models))]  # models sharing a GPU with model i under MPS
    fns = []
    for i, mc in enumerate(dep.models):
        mcost = cost.for_model(i)
        overlap = dep.scheduler.overlap if mc.overlap is None else mc.overlap
        rule = mc.graph_rule()
        inter = cost.interference(i, peers[i][0]) if peers[i] else None
        u, peer_tokens = load[i] if load is not None and inter is not None else (0.0, 0.0)

        def f(b: int, _c=mcost, _t=tpr[i], _r=rule, _o=overlap, _f=inter, _u=u, _p=peer_tokens) -> float:
            alone = expected_step_ms(_c, b, _t, ctx, _r) + _c.router_step_ms(b)
            if _f is not None:
                alone *= _f.mixed(max(1, round(b * _t)), _u, _p)
            return alone + (0.0 if _o else _c.host_ms(b))

        fns.append(f)
    return fns


def expected_step_ms(cost: ModelStepCost, rows: int, tokens_per_row: float, context: float, rule: GraphRule) -> float:
    """Expected step time of `rows` rows whose lengths are geometric with mean `tokens_per_row` (1 = decodes),
    split as `rule` splits them: without `allow_split` the step runs in the decode graphs when every row fits
    (probability P(len <= m)^rows) and as one varlen pass otherwise; with it, the short rows stay in the graph
    and the rest form a second pass (the split in expectation)."""
    if rows < 1:
        return 0.0
    t = max(1.0, tokens_per_row)
    m = min(rule.max_row_tokens, rule.max_tokens)
    fit = 1.0 - (1.0 - 1.0 / t) ** m if rule.enabled else 0.0  # P(length <= m)
    # E[length | <= m] and E[length | > m] (memoryless: m + t) of a geometric length with mean t.
    t_fit = (t - (m + t) * (1.0 - fit)) / fit if fit > 0 else 0.0
    p_long = (1.0 - 1.0 / t) ** SHORT_ROW_TOKENS  # P(length > 16): long rows of a varlen pass

    def part(n: float, k: float, long_frac: float = 0.0) -> PartStats:
        if n <= 0:
            return PartStats()
        toks = max(1, round(n * k))
        ext = toks if k > 1.0 + 1e-9 else 0
        return PartStats(max(1, round(n)), toks, ext, round(n * context), round(n * long_frac))

    if not rule.enabled or fit <= 0.0:
        return cost.step_ms(StepStats(eager=part(rows, t, p_long), graphs=rule.enabled))
    if rule.allow_split:
        n_graph = rows * fit
        return cost.step_ms(StepStats(part(n_graph, t_fit), part(rows - n_graph, m + t, p_long)))
    all_fit = fit**rows
    graph = cost.step_ms(StepStats(graph=part(rows, t_fit)))
    varlen = cost.step_ms(StepStats(eager=part(rows, t, p_long)))
    return all_fit * graph + (1.0 - all_fit) * varlen


def predict_thresholds(cfg: SimConfig, concurrency: int | None = None) -> Prediction:
    n = concurrency or cfg.concurrency
    check_search_concurrency(n)
    P, C, mean_output = markov_inputs(cfg)
    search = search_thresholds(MarkovModel.create(step_time_fns(cfg), P, C, n, DELTA_MS, mean_output))
    if not (shares_a_gpu(cfg) and n > 1 and search.ranked and len(cfg.deployment.models) == 2):
        return _searched(search)
    # Second pass: slow each model down for the share of time its peer was busy at the first pass's B*, beside a
    # pass of the peer's mean batch (the co-run factor depends on what the peer runs).
    load = peer_load(search.ranked[0], tokens_per_row(P))
    search = search_thresholds(MarkovModel.create(step_time_fns(cfg, load), P, C, n, DELTA_MS, mean_output))
    # That load belongs to one B: a B that holds the large model for fuller batches keeps it busy less often, so the
    # small model runs alone more and is faster than the pass assumed. Re-solve the pass's best and the large-batch
    # ladder each at its own co-location fixed point.
    steps_at = lambda ld: step_time_fns(cfg, ld)  # noqa: E731
    solved = solve_candidates(steps_at, P, C, n, DELTA_MS, mean_output, search, load)
    if not solved:
        return _searched(search)
    scored = sorted(solved.items(), key=lambda x: -x[1])
    note = "; ".join(x for x in (search.note, "co-location solved at each candidate's own load") if x)
    return Prediction(scored[0][0], float(scored[0][1]), scored, note)


def _searched(search: SearchOutcome) -> Prediction:
    """The search's own prediction (nan when it was too large to predict anything)."""
    predicted = search.throughput_tok_s if search.throughput_tok_s is not None else float("nan")
    ranked = [(r.thresholds, r.throughput_tok_s) for r in search.ranked]
    return Prediction(tuple(search.thresholds), float(predicted), ranked, search.note)


def markov_at(cfg: SimConfig, thresholds: tuple[int, ...], concurrency: int | None = None) -> ThroughputResult:
    """The Markov model's T(B) at one given B (the deployed one, not B*); under MPS at the co-location fixed point of
    that B (`colocated_at`)."""
    n = concurrency or cfg.concurrency
    if shares_a_gpu(cfg) and n > 1:
        return colocated_at(cfg, thresholds, n)
    P, C, mean_output = markov_inputs(cfg)
    return evaluate_thresholds(MarkovModel.create(step_time_fns(cfg), P, C, n, DELTA_MS, mean_output), thresholds)[0]


def colocated_at(cfg: SimConfig, thresholds: tuple[int, ...], concurrency: int,
                 load: Load | None = None) -> ThroughputResult:  # fmt: skip
    """T(B) with each model slowed by its co-runner as often as the chain at this very B keeps that peer busy
    (`tokenrouter.markov.colocation`); `load` is the start (default: the peers alone)."""
    P, C, mean_output = markov_inputs(cfg)
    steps_at = lambda ld: step_time_fns(cfg, ld)  # noqa: E731
    solved = solve_at_load(steps_at, P, C, concurrency, DELTA_MS, mean_output, thresholds, tokens_per_row(P), load=load)
    return solved[0]


def shares_a_gpu(cfg: SimConfig) -> bool:
    return any(colocated(cfg.deployment, i) for i in range(len(cfg.deployment.models)))


def with_thresholds(cfg: SimConfig, thresholds: Sequence[int], **policy: Any) -> SimConfig:
    """A new `cfg` delayed at `thresholds` (`PolicyConfig.with_thresholds`: a config's B(N) table goes), with the
    other `PolicyConfig` fields given; `cfg` stays as it is."""
    pc = dataclasses.replace(cfg.deployment.policy.with_thresholds(thresholds), **policy)
    return dataclasses.replace(cfg, deployment=dataclasses.replace(cfg.deployment, policy=pc))


def simulate_thresholds(cfg: SimConfig, thresholds: tuple[int, ...]) -> SimResult:
    """A candidate B simulated as it is: delayed, without a tuned config's B(N) table (which would win over the
    candidate at its N) and without autotune (which would move it)."""
    return run_sim(with_thresholds(cfg, thresholds, autotune=None))


def simulated_summary(cfg: SimConfig, thresholds: tuple[int, ...]) -> dict[str, Any]:
    """`simulate_thresholds`' summary: what a worker process sends back (`sim.sim_pool`)."""
    return simulate_thresholds(cfg, thresholds).summary


def tune_point(cfg: SimConfig, concurrency: int, top: int = 3, pool: Executor | None = None) -> TunePoint:
    """B* for one concurrency: Markov top-k, eager (1,..,1) and the large-batch ladder, each checked in
    the simulator (on `pool`'s processes when given: the same numbers, sooner); the fastest simulated wins."""
    c = dataclasses.replace(cfg, concurrency=concurrency)
    pred = predict_thresholds(c)
    cands = [b for b, _ in pred.ranked[:top]] or [pred.thresholds]
    eager = (1,) * len(cfg.deployment.models)
    for b in [eager, *large_batch_ladder(concurrency, len(cfg.deployment.models))]:
        if b not in cands:
            cands.append(b)
    simulated, tpot = {}, {}
    runs = (pool.map if pool is not None else map)(simulated_summary, [c] * len(cands), cands)
    for b, s in zip(cands, runs, strict=True):
        simulated[b] = s.get("steady_output_throughput_tok_s", s["output_throughput_tok_s"])
        tpot[b] = (s["tpot_ms_p50"], s["tpot_ms_p99"])
    best = max(simulated, key=lambda b: (simulated[b], b == pred.thresholds))
    return TunePoint(concurrency, pred, simulated, best, tpot[best])


# -- choosing among placements (and SM splits): each candidate with its own tuned B --------------------------------


@dataclass(slots=True)
class Candidate:
    """One deployment `trsim tune` compared: a layout on G GPUs and/or an MPS SM split, tuned at every N.
    `deployment` is the candidate as simulated (placement, GPUs, tp, shares); `gpus` the GPUs it occupies."""

    label: str
    deployment: DeploymentConfig
    points: list[TunePoint]
    gpus: int
    layout: Layout | None = None
    split: tuple[int, int] | None = None
    estimated: list[str] = field(default_factory=list)  # what its prices rest on that was not measured
    usd_per_hour: float | None = None  # what its GPUs cost an hour (None: no prices given)

    def point(self, n: int) -> TunePoint:
        return next(p for p in self.points if p.concurrency == n)

    def throughput(self, n: int) -> float:
        """Simulated steady throughput at N with the B tuned for it (tok/s, all GPUs together)."""
        return self.point(n).best_throughput

    def per_gpu(self, n: int) -> float:
        return self.throughput(n) / self.gpus

    def usd_per_mtok(self, n: int) -> float | None:
        """USD per million output tokens at N: the GPUs' price an hour over the tokens they write in one."""
        return None if self.usd_per_hour is None else usd_per_mtok(self.usd_per_hour, self.throughput(n))

    def score(self, n: int, objective: TuneObjective | str) -> float:
        goal = TuneObjective(str(objective))
        if goal is TuneObjective.COST:
            usd = self.usd_per_mtok(n)
            if usd is None:
                raise ValueError("--objective cost needs --gpu-prices")
            return -usd
        return self.per_gpu(n) if goal is TuneObjective.PER_GPU else self.throughput(n)


def choose(candidates: list[Candidate], n: int, objective: TuneObjective | str) -> Candidate:
    """The candidate with the best objective at N (most tok/s, most per GPU, or least USD per million tokens); on a
    tie the one with fewer GPUs, then the first listed."""
    order = {id(c): k for k, c in enumerate(candidates)}
    return max(candidates, key=lambda c: (c.score(n, objective), -c.gpus, -order[id(c)]))
