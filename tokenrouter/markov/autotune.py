"""The Markov model as autotune's solve (`tokenrouter.core.autotune`): estimates -> B*, within a state budget.

The core controller is pure and must not import scipy; the simulator and the runtime's front-end build the
controller here (`make_controller`), with this solve injected, from the same deployment config, so both run the
same controller with the same solve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tokenrouter.core.autotune import AutotuneController, Estimates, Solution
from tokenrouter.core.config import AutotuneConfig, DeploymentConfig
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import Policy, clamp_thresholds
from tokenrouter.markov.colocation import Load, large_batch_ladder, peer_load, solve_at_load, tokens_per_row
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.markov.model import MarkovModel
from tokenrouter.markov.presets import me_preset, r2r_preset, router_matrices, rstitch_preset
from tokenrouter.markov.search import SearchOutcome, evaluate_thresholds, scale_thresholds, search_thresholds

DELTA_MS = 0.1  # the quantum `trsim tune` uses; the search coarsens it (within 2% per step) to fit its budget
CO_RUN_CANDIDATES = 3  # as `trsim tune`: the search's best re-solved at their own co-location load, beside the ladder

Slowdown = Callable[[int, float, float], float]
"""(own tokens per pass, peer busy fraction, peer tokens per pass) -> the model's mean step-time factor."""


@dataclass(slots=True)
class CoRun:
    """How co-located models slow each other (from the profile's measured factors), so that step times measured
    live at the B in force can be re-priced at another B: per model, its slowdown at a load, or None for a model
    that shares no GPU."""

    slowdown: list[Slowdown | None] = field(default_factory=list)

    def mix(self, i: int, own_tokens: float, load: Load | None) -> float:
        f = self.slowdown[i]
        if f is None or load is None:
            return 1.0
        u, peer_tokens = load[i]
        return f(max(1, round(own_tokens)), u, peer_tokens)


@dataclass(slots=True)
class MarkovSolver:
    """`Solve` for two-model geometric routers (r2r, citer, co-llm: the small model's hop probability; r-stitch,
    markov: also the large model's hand-back probability) and the ME ensemble (deterministic routing: only step
    times, mean output and N move). `hop_rate`/`return_prob`: what to assume for a model that has routed
    nothing yet (the deployment's configured values). `max_states`: the search's budget, its time box."""

    router: str
    num_models: int = 2
    hop_rate: float = 0.1
    return_prob: float = 1.0
    max_states: int = 50_000
    delta_ms: float = DELTA_MS
    corun: CoRun | None = None  # models sharing a GPU: solve each B at its own load (tokenrouter.markov.colocation)

    def matrices(self, hop_prob: tuple[float | None, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(P, C) of the Markov model for the estimated hop probabilities."""
        key = str(self.router).lower()
        if key == RouterName.ME:
            return me_preset(self.num_models)
        p = hop_prob[0] if hop_prob and hop_prob[0] is not None else self.hop_rate
        q = hop_prob[1] if len(hop_prob) > 1 and hop_prob[1] is not None else self.return_prob
        if key in (RouterName.R_STITCH, RouterName.MARKOV):
            return rstitch_preset(p, max(q, 1e-6))  # q = 0 would never hand back: no stationary regime
        return r2r_preset(p)

    def __call__(self, est: Estimates, current: tuple[int, ...]) -> Solution:
        P, C = self.matrices(est.hop_prob)
        n = est.concurrency
        if self.corun is not None and n > 1 and self.num_models == 2:
            try:
                return self._solve_colocated(est, current, P, C)
            except StateSpaceTooLarge:
                pass  # the chains at this N are over the budget: the plain search below scales down
        model = MarkovModel.create(est.step_table(n), P, C, n, self.delta_ms, est.mean_output)
        out = search_thresholds(model, self.max_states)
        cur = clamp_thresholds(current, n)
        t_best, t_cur = out.throughput_tok_s, self._throughput(out, cur)
        if t_best is not None and t_cur is not None:
            return Solution(tuple(out.thresholds), t_best, t_cur, out.note)
        # The chains at N are over the budget even on the search's fallbacks: compare on the largest N' = N/2,
        # N/4, .. where both fit, the B in force scaled to N' against B*(N'), and scale B*(N') back to N, as the
        # search itself scales (B grows about in proportion to N). Throughputs are then the ones at N'.
        m = n
        while m > 1:
            m //= 2
            small = search_thresholds(model.with_concurrency(m), self.max_states)
            cur_m = scale_thresholds(cur, n, m)
            tb, tc = small.throughput_tok_s, self._throughput(small, cur_m)
            if tb is not None and tc is not None:
                b = scale_thresholds(small.thresholds, m, n)
                b_in, cur_in = ",".join(map(str, small.thresholds)), ",".join(map(str, cur_m))
                note = f"{out.note}; compared at N={m}: B*={b_in} against the B in force scaled to {cur_in}"
                return Solution(b, tb, tc, note)
        return Solution(tuple(out.thresholds), t_best, t_cur, out.note)

    def _solve_colocated(self, est: Estimates, current: tuple[int, ...], P: np.ndarray, C: np.ndarray) -> Solution:
        """The measured step times hold the interference of the B in force (its load). Take that load out (the
        chain at the B in force gives each peer's busy fraction and pass size), then solve the search's best
        candidates and the large-batch ladder each at its own co-location fixed point, as `trsim tune` does."""
        n, corun = est.concurrency, self.corun
        assert corun is not None
        tpr = tokens_per_row(P)
        measured = est.step_table(n)
        cur = clamp_thresholds(current, n)
        at_cur = evaluate_thresholds(MarkovModel.create(measured, P, C, n, self.delta_ms, est.mean_output), cur,
                                     self.max_states)[0]  # fmt: skip
        load_cur = peer_load(at_cur, tpr)
        alone = [[measured[i][b - 1] / corun.mix(i, b * tpr[i], load_cur) for b in range(1, n + 1)]
                 for i in range(len(measured))]  # fmt: skip

        def steps_at(load: Load | None) -> Sequence[list[float]]:
            return [[alone[i][b - 1] * corun.mix(i, b * tpr[i], load) for b in range(1, n + 1)]
                    for i in range(len(alone))]  # fmt: skip

        search = search_thresholds(MarkovModel.create(measured, P, C, n, self.delta_ms, est.mean_output),
                                   self.max_states)  # fmt: skip
        cands = [tuple(r.thresholds) for r in search.ranked[:CO_RUN_CANDIDATES]] or [tuple(search.thresholds)]
        held = max(b[-1] for b in cands)
        cands += [b for b in large_batch_ladder(n, 2) if b not in cands and b[-1] > held]
        if cur not in cands:
            cands.append(cur)
        scored: dict[tuple[int, ...], float] = {}
        for b in cands:
            try:
                res, _ = solve_at_load(steps_at, P, C, n, self.delta_ms, est.mean_output, b, tpr, load=load_cur,
                                       max_states=self.max_states)  # fmt: skip
            except (StateSpaceTooLarge, ValueError):
                continue
            scored[b] = res.throughput_tok_s
        if cur not in scored:
            raise StateSpaceTooLarge(self.max_states, self.num_models, n)
        best = max(scored, key=lambda b: (scored[b], b == cur))
        note = f"co-location re-priced per B from the load at {','.join(map(str, cur))}"
        return Solution(best, scored[best], scored[cur], note)

    def _throughput(self, out: SearchOutcome, b: tuple[int, ...]) -> float | None:
        """T(b) on the model the search settled on (its quantum may be coarser than asked), so a gain compares like
        with like; None when that chain does not fit the budget."""
        found = next((r.throughput_tok_s for r in out.ranked if r.thresholds == b), None)
        if found is not None:
            return found
        try:
            res, _, _ = evaluate_thresholds(out.model, b, self.max_states)
        except StateSpaceTooLarge:
            return None
        return res.throughput_tok_s


def drops_token(router: str, num_models: int) -> tuple[bool, ...]:
    """Per model: does its hand-off drop the token it sampled? (the commit matrix's off-diagonal is 0)."""
    _, C = router_matrices(str(router), num_models, hop_rate=0.5, return_prob=0.5, mean_small_run=2.0,
                           mean_large_run=2.0)  # fmt: skip
    return tuple(all(C[i][j] == 0 for j in range(num_models) if j != i) for i in range(num_models))


def make_controller(dep: DeploymentConfig, config: AutotuneConfig | None = None,
                    policy: Policy | None = None, cost: CostLike | None = None) -> AutotuneController:  # fmt: skip
    """The controller of a deployment: its `policy.autotune` settings (or `config`), its policy in force (or
    `policy`), the Markov solve for its router, with co-location factors from `cost` (the simulator passes its cost
    model; default: the deployment's profile). ValueError when the deployment cannot be autotuned."""
    cfg = config or dep.policy.autotune or AutotuneConfig()
    rc, m = dep.router, len(dep.models)
    p, q = rc.hop_rate, rc.return_prob
    if rc.name == RouterName.MARKOV and rc.mean_small_run and rc.mean_large_run:
        p, q = 1.0 / rc.mean_small_run, 1.0 / rc.mean_large_run
    solver = MarkovSolver(str(rc.name), m, p, q, cfg.max_states, corun=corun_of(dep, cost))
    return AutotuneController(cfg, policy or dep.policy.build(), solver, drops_token(str(rc.name), m))


class CostLike(Protocol):
    def interference(self, model: int, peer: int) -> Any: ...


def corun_of(dep: DeploymentConfig, cost: CostLike | None = None) -> CoRun | None:
    """The co-location factors (`cost`'s, else the deployment profile's) of a deployment whose models share a GPU
    under MPS; None when none do or the profile cannot price the pair (autotune then solves on the measured step
    times as they are)."""
    from tokenrouter.deploy.placement import colocated

    peers = [colocated(dep, i) for i in range(len(dep.models))]
    if not any(peers):
        return None
    try:
        if cost is None:
            from tokenrouter.calibration.cost import CostModel

            cost = CostModel(dep.profile, dep.placement.mode, models=[m.name for m in dep.models],
                             shares=[m.mps_active_thread_percentage for m in dep.models])  # fmt: skip
        inter = [cost.interference(i, p[0]) if p else None for i, p in enumerate(peers)]
    except (ValueError, KeyError):  # ProfileError and ColocationError are ValueErrors
        return None

    def slowdown(f) -> Slowdown:
        return lambda own, u, peer_tokens: (1.0 - u) * f.cap(own) + u * f.factor(own, max(1, round(peer_tokens)))

    return CoRun([None if f is None else slowdown(f) for f in inter])
