"""Threshold tuning: the Markov model proposes B per concurrency, the simulator checks it.

The Markov model (tokenrouter/markov) assumes geometric hops and a step time that depends on batch size only;
here that L_i(b) comes from the deployment's cost model at the workload's mean context, so a prediction
is cheap. The simulator then runs the top candidates with the real length distributions, context growth,
prefills, message latency and MPS interference, and the measured best wins.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.profile import load_profile
from tokenrouter.calibration.step_stats import PartStats, StepStats
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.policy import PolicyKind
from tokenrouter.markov import MarkovModel, router_matrices, search_thresholds
from tokenrouter.sim.run import SimConfig, SimResult, run_sim
from tokenrouter.workloads import make_workload

DELTA_MS = 0.1


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

    @property
    def best_throughput(self) -> float:
        return self.simulated[self.best]


def routing_matrices(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    rc = cfg.deployment.router
    return router_matrices(
        rc.name,
        len(cfg.deployment.models),
        hop_rate=rc.hop_rate,
        return_prob=rc.return_prob,
        mean_small_run=rc.mean_small_run,
        mean_large_run=rc.mean_large_run,
    )


def tokens_per_row(P: np.ndarray) -> list[float]:
    """Mean tokens a row feeds on each of two models: the first step of a visit feeds what the peer wrote
    in its run (about its run length r_j = 1/(1 - P_jj) tokens), the other r_i - 1 steps feed one each."""
    if len(P) != 2:  # ME: every visit feeds the one token committed since the model's last visit
        return [1.0] * len(P)
    r = [1.0 / max(1e-9, 1.0 - float(P[i][i])) for i in range(2)]
    return [(r[1 - i] + r[i] - 1.0) / r[i] for i in range(2)]


def step_time_fns(cfg: SimConfig, corun: list[float] | None = None) -> list[Callable[[int], float]]:
    """L_i(b) in ms: b rows at the workload's mean context, split by the model's graph rule, plus router and
    (without overlap) host time. When the models share a GPU, model i's step is slowed by MPS for the
    fraction `corun[i]` of time its peer runs."""
    dep = cfg.deployment
    names = [m.name for m in dep.models]
    cost = cfg.cost if cfg.cost is not None else CostModel(load_profile(dep.profile), dep.placement.mode, models=names)
    specs = make_workload(cfg.workload, min(cfg.num_requests, 256), cfg.seed, max_output=cfg.max_output)
    ctx = float(np.mean([s.prompt_len + s.output_len / 2 for s in specs]))
    shared = dep.placement.mode == "mps"
    tpr = tokens_per_row(routing_matrices(cfg)[0])
    fns = []
    for i, mc in enumerate(dep.models):
        mcost = cost.for_model(i)
        overlap = dep.scheduler.overlap if mc.overlap is None else mc.overlap
        extra = cost.router_ms(i) + (0.0 if overlap else cost.sched_ms(i))
        u = corun[i] if shared and corun is not None else 0.0
        rule = mc.graph_rule()

        def f(b: int, _c=mcost, _x=extra, _u=u, _t=tpr[i], _r=rule) -> float:
            stats = expected_step(b, _t, ctx, _r)
            alone = _c.step_ms(stats)
            slow = _c.step_ms(stats, corunning=True) if _u else alone
            return (1 - _u) * alone + _u * slow + _x

        fns.append(f)
    return fns


def expected_step(rows: int, tokens_per_row: float, context: float, rule: GraphRule) -> StepStats:
    """A step of `rows` rows whose lengths are geometric with mean `tokens_per_row` (1 = all decodes), split
    by `rule` in expectation: the rows of at most `rule.max_row_tokens` tokens run in the graph part."""
    t = max(1.0, tokens_per_row)
    m = min(rule.max_row_tokens, rule.max_tokens)
    fit = 1.0 - (1.0 - 1.0 / t) ** m if rule.enabled else 0.0  # P(length <= m)
    n_graph = round(rows * fit)
    n_eager = rows - n_graph
    # E[length | <= m] and E[length | > m] (memoryless: m + t) of a geometric length with mean t.
    t_graph = (t - (m + t) * (1.0 - fit)) / fit if fit > 0 else 0.0
    t_eager = m + t if fit > 0 else t

    def part(n: int, k: float) -> PartStats:
        if n == 0:
            return PartStats()
        toks = round(n * k)
        return PartStats(n, toks, toks if k > 1.0 + 1e-9 else 0, round(n * context))

    return StepStats(part(n_graph, t_graph), part(n_eager, t_eager))


def predict_thresholds(cfg: SimConfig, concurrency: int | None = None) -> Prediction:
    n = concurrency or cfg.concurrency
    P, C = routing_matrices(cfg)
    specs = make_workload(cfg.workload, min(cfg.num_requests, 256), cfg.seed, max_output=cfg.max_output)
    mean_output = max(1.0, float(np.mean([s.output_len for s in specs])))
    search = search_thresholds(MarkovModel.create(step_time_fns(cfg), P, C, n, DELTA_MS, mean_output))
    if cfg.deployment.placement.mode == "mps" and n > 1 and search.ranked:
        # Second pass: slow each model down for the share of time its peer was busy at the first pass's B*.
        busy = search.ranked[0].busy_fraction
        corun = [max(busy[j] for j in range(len(busy)) if j != i) for i in range(len(busy))]
        search = search_thresholds(MarkovModel.create(step_time_fns(cfg, corun), P, C, n, DELTA_MS, mean_output))
    ranked = [(r.thresholds, r.throughput_tok_s) for r in search.ranked]
    predicted = search.throughput_tok_s if search.throughput_tok_s is not None else float("nan")
    return Prediction(tuple(search.thresholds), float(predicted), ranked, search.note)


def simulate_thresholds(cfg: SimConfig, thresholds: tuple[int, ...]) -> SimResult:
    c = copy.copy(cfg)
    c.deployment = copy.deepcopy(cfg.deployment)
    c.deployment.policy.kind = PolicyKind.DELAYED.value
    c.deployment.policy.thresholds = list(thresholds)
    return run_sim(c)


def tune_point(cfg: SimConfig, concurrency: int, top: int = 3) -> TunePoint:
    """B* for one concurrency: Markov top-k plus eager (1,..,1), each checked in the simulator."""
    c = copy.copy(cfg)
    c.concurrency = concurrency
    pred = predict_thresholds(c)
    cands = [b for b, _ in pred.ranked[:top]] or [pred.thresholds]
    eager = (1,) * len(cfg.deployment.models)
    if eager not in cands:
        cands.append(eager)
    simulated = {}
    for b in cands:
        s = simulate_thresholds(c, b).summary
        simulated[b] = s.get("steady_output_throughput_tok_s", s["output_throughput_tok_s"])
    best = max(simulated, key=lambda b: (simulated[b], b == pred.thresholds))
    return TunePoint(concurrency, pred, simulated, best)
