"""The Markov model as autotune's solve (`tokenrouter.core.autotune`): estimates -> B*, within a state budget.

The core controller is pure and must not import scipy; the simulator and the runtime's front-end build the
controller with this solve injected (`tokenrouter.deploy.autotune_controller.make_controller`), from the same
deployment config, so both run the same controller with the same solve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.core.autotune import Estimates, Solution
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import clamp_thresholds
from tokenrouter.markov.colocation import DELTA_MS, Load, peer_load, solve_candidates, tokens_per_row
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.markov.model import MarkovModel
from tokenrouter.markov.presets import router_matrices
from tokenrouter.markov.search import SearchOutcome, evaluate_thresholds, scale_thresholds, search_thresholds

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
        p = hop_prob[0] if hop_prob and hop_prob[0] is not None else self.hop_rate
        q = hop_prob[1] if len(hop_prob) > 1 and hop_prob[1] is not None else self.return_prob
        # markov's law is r-stitch's with its run rates estimated; q = 0 would never hand back: no stationary regime
        name = RouterName.R_STITCH if str(self.router).lower() == RouterName.MARKOV else self.router
        return router_matrices(name, self.num_models, hop_rate=p, return_prob=max(q, 1e-6))

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
        model = MarkovModel.create(measured, P, C, n, self.delta_ms, est.mean_output)
        load_cur = peer_load(evaluate_thresholds(model, cur, self.max_states)[0], tpr)
        alone = [[measured[i][b - 1] / corun.mix(i, b * tpr[i], load_cur) for b in range(1, n + 1)]
                 for i in range(len(measured))]  # fmt: skip

        def steps_at(load: Load | None) -> Sequence[list[float]]:
            return [[alone[i][b - 1] * corun.mix(i, b * tpr[i], load) for b in range(1, n + 1)]
                    for i in range(len(alone))]  # fmt: skip

        scored = solve_candidates(steps_at, P, C, n, self.delta_ms, est.mean_output,
                                  search_thresholds(model, self.max_states), load_cur, also=(cur,),
                                  max_states=self.max_states)  # fmt: skip
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
