"""The Markov model as autotune's solve (`tokenrouter.core.autotune`): estimates -> B*, within a state budget.

The core controller is pure and must not import scipy; the simulator and the runtime's front-end build the
controller here (`make_controller`), with this solve injected, from the same deployment config, so both run the
same controller with the same solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenrouter.core.autotune import AutotuneController, Estimates, Solution
from tokenrouter.core.config import AutotuneConfig, DeploymentConfig
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import Policy, clamp_thresholds
from tokenrouter.markov.explore import StateSpaceTooLarge
from tokenrouter.markov.model import MarkovModel
from tokenrouter.markov.presets import me_preset, r2r_preset, router_matrices, rstitch_preset
from tokenrouter.markov.search import SearchOutcome, evaluate_thresholds, scale_thresholds, search_thresholds

DELTA_MS = 0.1  # the quantum `trsim tune` uses; the search coarsens it (within 2% per step) to fit its budget


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
                    policy: Policy | None = None) -> AutotuneController:  # fmt: skip
    """The controller of a deployment: its `policy.autotune` settings (or `config`), its policy in force (or
    `policy`), the Markov solve for its router. ValueError when the deployment cannot be autotuned."""
    cfg = config or dep.policy.autotune or AutotuneConfig()
    rc, m = dep.router, len(dep.models)
    p, q = rc.hop_rate, rc.return_prob
    if rc.name == RouterName.MARKOV and rc.mean_small_run and rc.mean_large_run:
        p, q = 1.0 / rc.mean_small_run, 1.0 / rc.mean_large_run
    solver = MarkovSolver(str(rc.name), m, p, q, cfg.max_states)
    return AutotuneController(cfg, policy or dep.policy.build(), solver, drops_token(str(rc.name), m))
