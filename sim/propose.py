"""The Markov model's side of a decision (`sim.decide`): a few candidate B at one N from two budgeted searches
(alone, then co-located), and the inputs it takes from a simulator config (docs/simulator.md#choosing-b).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.calibration.cost import ModelStepCost
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.calibration.step_stats import SHORT_ROW_TOKENS, PartStats, StepStats
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.names import RouterName
from tokenrouter.deploy.placement import colocated
from tokenrouter.markov import MarkovModel, ThroughputResult, evaluate_thresholds, search_thresholds
from tokenrouter.markov.colocation import DELTA_MS, Load, peer_load, solve_at_load, tokens_per_row
from tokenrouter.markov.presets import matrices
from tokenrouter.routers.presets import router_law
from tokenrouter.routers.trace_law import law_note, law_router, replayed_runs
from tokenrouter.sim.loop import SimConfig, cost_model
from tokenrouter.workloads import make_workload

B = tuple[int, ...]

MAX_SEARCH_CONCURRENCY = 1024
"""Largest N the Markov model is solved at: its search time grows about linearly in N (about 20 s at N = 1,000 on
one core, over 2 minutes at N = 4,096, hours at N = 100,000), so past this N a command refuses at once."""


def check_search_concurrency(n: int, hint: str = "") -> None:
    """ValueError (a one-line user error on the command lines) when N is past `MAX_SEARCH_CONCURRENCY`."""
    if n > MAX_SEARCH_CONCURRENCY:
        raise ValueError(f"N = {n:,} is too large for the Markov model: it is solved at N <= "
                         f"{MAX_SEARCH_CONCURRENCY:,} (its time grows with N: minutes at a few thousand, hours "
                         f"beyond){hint}")  # fmt: skip


def routing_matrices(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    return matrices(router_law(cfg.deployment.router, len(cfg.deployment.models)))


def workload_means(cfg: SimConfig) -> tuple[float, float]:
    """(mean context a row attends, mean output tokens) of the configured workload."""
    specs = make_workload(cfg.workload, min(cfg.num_requests, 256), cfg.seed, max_output=cfg.max_output)
    ctx = float(np.mean([s.prompt_len + s.output_len / 2 for s in specs]))
    return ctx, max(1.0, float(np.mean([s.output_len for s in specs])))


def markov_inputs(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """The routing and commit matrices and the mean output length the Markov model of `cfg` takes."""
    P, C = routing_matrices(cfg)
    return P, C, workload_means(cfg)[1]


def step_time_fns(cfg: SimConfig, load: list[tuple[float, float]] | None = None) -> list[Callable[[int], float]]:
    """L_i(b) in ms from the simulator's own cost model (docs/simulator.md#choosing-b). `load[i]` = (fraction of time
    the co-located peer runs, tokens of its pass): model i's pass is slowed by the co-run factor that share of the
    time and by its SM-cap factor the rest."""
    dep = cfg.deployment
    cost = cfg.cost if cfg.cost is not None else cost_model(dep, load_profile(dep.profile))
    ctx, _ = workload_means(cfg)
    tpr = tokens_per_row(routing_matrices(cfg)[0])
    peers = [colocated(dep, i) for i in range(len(dep.models))]  # models sharing a GPU with model i under MPS
    fns = []
    for i, mc in enumerate(dep.models):
        mcost = cost.for_model(i)
        overlap = dep.overlaps(i)
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
    """Expected step time of `rows` rows of geometric lengths with mean `tokens_per_row`, split as `rule` splits
    them: without `allow_split`, in the decode graphs when every row fits (P(len <= m)^rows), else one varlen pass;
    with it, the short rows stay in the graph and the rest form a second pass."""
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


def markov_at(cfg: SimConfig, thresholds: tuple[int, ...], concurrency: int | None = None) -> ThroughputResult:
    """The Markov model's T(B) at one given B; under MPS at that B's co-location fixed point (`colocated_at`)."""
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


@dataclass(slots=True)
class Proposals:
    """The Markov model's candidates at one N, best first, with predicted tok/s (nan: none), and its search's note."""

    ranked: list[tuple[B, float]] = field(default_factory=list)
    note: str = ""


PROPOSAL_STATES = 5_000
"""State budget of each of the two searches (about 0.2 s at N = 8, 0.6-1.3 s at N = 64, on one core)."""


def markov_view(cfg: SimConfig) -> tuple[SimConfig, str]:
    """`cfg` as the Markov model takes it (a trace replay: the `markov` router of its runs), and a note of that."""
    rc = cfg.deployment.router
    if rc.name != RouterName.TRACE:
        return cfg, ""
    specs = make_workload(cfg.workload, cfg.num_requests, cfg.seed, max_output=cfg.max_output)
    law = law_router(rc, replayed_runs(rc, specs))
    return dataclasses.replace(cfg, deployment=dataclasses.replace(cfg.deployment, router=law)), law_note(law)


def propose(cfg: SimConfig, concurrency: int) -> Proposals:
    """The Markov model's candidates for `cfg`'s deployment at N, best first (a trace replay: `markov_view`)."""
    check_search_concurrency(concurrency)
    cfg, stand_in = markov_view(cfg)
    P, C, mean_output = markov_inputs(cfg)
    model = MarkovModel.create(step_time_fns(cfg), P, C, concurrency, DELTA_MS, mean_output)
    alone = search_thresholds(model, PROPOSAL_STATES)
    searches = [alone]
    if shares_a_gpu(cfg) and concurrency > 1 and alone.ranked and len(P) == 2:
        load = peer_load(alone.ranked[0], tokens_per_row(P))
        loaded = MarkovModel.create(step_time_fns(cfg, load), P, C, concurrency, DELTA_MS, mean_output)
        searches.insert(0, search_thresholds(loaded, PROPOSAL_STATES))
    ranked: dict[B, float] = {}
    for s in searches:  # each search's B* first, then the rest of their rankings
        ranked.setdefault(tuple(s.thresholds), math.nan if s.throughput_tok_s is None else s.throughput_tok_s)
    for s in searches:
        for r in s.ranked:
            ranked.setdefault(tuple(r.thresholds), r.throughput_tok_s)
    note = "; ".join(x for x in (stand_in, searches[0].note) if x)
    return Proposals(list(ranked.items()), note)
