"""The one decider of the delayed-batching thresholds B: the Markov model proposes, the simulator ranks, the best
simulated B wins (`trsim run`, `trsim tune` and autotune all call `decide`). The search, what a trial is, the
objectives and why both models: docs/simulator.md#choosing-b.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from tokenrouter.core.policy import format_b, guard_holds
from tokenrouter.sim.loop import SimConfig, simulate_config
from tokenrouter.sim.propose import B, Proposals, propose

EXHAUSTIVE_LIMIT = 6
"""Feasible sets this small are scouted whole (N <= 3 for two models)."""
START_CANDIDATES = 3
"""Markov proposals simulated before the compass search."""
FINALISTS = 3
"""Scouted B judged on full trials."""
DEFAULT_BUDGET_S = 60.0
"""Wall-clock budget of one decision unless the caller gives one."""


@dataclass(frozen=True, slots=True)
class Trial:
    """What one simulated candidate measured: steady output throughput (tok/s) and TPOT p50/p99 (ms)."""

    thresholds: B
    tok_s: float
    tpot_p50_ms: float
    tpot_p99_ms: float


@dataclass(frozen=True, slots=True)
class Objective:
    """What "best" means: the most steady tok/s (among the B whose TPOT p99 meets `slo_tpot_ms`, when set). A B
    that misses the SLO ranks below every B that meets it; among those, lower TPOT first (the search walks in)."""

    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        if self.slo_tpot_ms is not None and not (math.isfinite(self.slo_tpot_ms) and self.slo_tpot_ms > 0):
            raise ValueError(f"--slo-tpot-ms must be a number of ms > 0, got {self.slo_tpot_ms}")

    def meets(self, t: Trial) -> bool:
        return self.slo_tpot_ms is None or t.tpot_p99_ms <= self.slo_tpot_ms

    def rank(self, t: Trial) -> tuple[bool, float]:
        return (True, t.tok_s) if self.meets(t) else (False, -t.tpot_p99_ms)

    def describe(self) -> str:
        return "steady tok/s" if self.slo_tpot_ms is None else f"steady tok/s with TPOT p99 <= {self.slo_tpot_ms:g} ms"


THROUGHPUT = Objective()
"""The default objective: the most steady tok/s, no latency target."""


@dataclass(slots=True)
class Choice:
    """A decision at one N. `thresholds`: the chosen B (None when no B met the SLO); `trials`: the finalists' full
    trials; `markov`: the Markov model's proposals (B, predicted tok/s), best first; `note`: what limited the search."""

    concurrency: int
    thresholds: B | None
    trials: dict[B, Trial]
    markov: list[tuple[B, float]]
    objective: Objective
    note: str = ""
    seconds: float = 0.0
    markov_note: str = ""  # what the Markov search reduced to fit its budget
    scouted: dict[B, Trial] = field(default_factory=dict)  # the short trials of the search

    @property
    def best(self) -> Trial | None:
        return None if self.thresholds is None else self.trials[self.thresholds]

    @property
    def markov_best(self) -> B | None:
        return self.markov[0][0] if self.markov else None

    def describe(self) -> str:
        """One line: what was chosen and how, as the commands print it."""
        n, tried = self.concurrency, len(self.scouted) or len(self.trials)
        stand_in = self.markov_note.split(";")[0] if self.markov_note.startswith("the trace") else ""
        mk = f"; Markov proposed {format_b(self.markov_best)}" if self.markov else ""
        mk += f" at {stand_in}" if stand_in and self.markov else ""
        how = f"best of {tried} B simulated at N={n} ({self.objective.describe()}{mk})"
        if self.thresholds is None:
            low = min(self.trials.values(), key=lambda t: t.tpot_p99_ms)
            how = (f"no B meets TPOT p99 <= {self.objective.slo_tpot_ms:g} ms at N={n}: the lowest simulated was "
                   f"{low.tpot_p99_ms:.2f} ms at B = {format_b(low.thresholds)} ({tried} B simulated)")  # fmt: skip
        return how + (f"; {self.note}" if self.note else "")


# -- the search --------------------------------------------------------------------------------------------------


def feasible(b: Sequence[int], concurrency: int) -> bool:
    """B the deployment may run at N: every B_i >= 1 and the core's deadlock guard."""
    return all(x >= 1 for x in b) and guard_holds(b, concurrency)


def feasible_set(num_models: int, concurrency: int, limit: int) -> list[B] | None:
    """Every feasible B in lexicographic order, or None when there are more than `limit`."""
    out: list[B] = []

    def rec(prefix: tuple[int, ...]) -> bool:
        if len(prefix) == num_models:
            if feasible(prefix, concurrency):
                out.append(prefix)
            return len(out) <= limit
        x = 1
        while feasible((*prefix, x) + (1,) * (num_models - len(prefix) - 1), concurrency):
            if not rec((*prefix, x)):
                return False
            x += 1
        return True

    return out if rec(()) else None


def neighbours(b: B, steps: Sequence[int], concurrency: int) -> list[B]:
    """The feasible compass moves: one step up and down per B_i, one step traded between two models (along the
    deadlock guard's edge, where the best B often sits), for two models both up or both down; a move over the edge
    stops on it (`onto_edge`: dropped, long steps at large N kept autotune's search inside, 9.5% short live)."""
    out = []
    m = len(b)
    moves = [{i: d} for i, s in enumerate(steps) for d in (s, -s)]
    moves += [{i: s, j: -s} for i in range(m) for j in range(m) if i != j for s in [min(steps[i], steps[j])]]
    if m == 2:  # and both up or both down: on a flat ridge the best holds both models longer together
        moves += [{0: d * steps[0], 1: d * steps[1]} for d in (1, -1)]
    for mv in moves:
        c = onto_edge(b, tuple(x + mv.get(k, 0) for k, x in enumerate(b)), concurrency)
        if c != tuple(b) and feasible(c, concurrency) and c not in out:
            out.append(c)
    return out


def onto_edge(b: B, c: B, concurrency: int) -> B:
    """Move `b` -> `c` shortened until the deadlock guard holds: the raised B_i lowered one at a time, the one
    raised most first (the last on ties); `c` itself when it is feasible or no raised B_i is left to lower."""
    c = list(c)
    while not guard_holds(c, concurrency) and (up := [(c[k] - b[k], k) for k in range(len(c)) if c[k] > b[k]]):
        c[max(up)[1]] -= 1
    return tuple(c)


Evaluate = Callable[[list[B]], list[Trial]]
"""Simulates candidates (possibly in parallel) and returns their trials in the same order."""


def scout(evaluate: Evaluate, start: Sequence[B], concurrency: int, num_models: int, objective: Objective,
          budget_s: float, *, progress: Callable[[int, Trial], None] | None = None,
          clock: Callable[[], float] = time.monotonic) -> tuple[dict[B, Trial], str]:  # fmt: skip
    """Trials of the B the search visited, and a note ("" unless the budget cut it short): small feasible sets
    whole, else `start` and then the compass search. `progress(done, trial)` after each trial."""
    t0 = clock()
    trials: dict[B, Trial] = {}

    def run(cands: list[B]) -> None:
        cands = [c for c in dict.fromkeys(cands) if c not in trials]
        for t in evaluate(cands) if cands else []:
            trials[t.thresholds] = t
            if progress is not None:
                progress(len(trials), t)

    whole = feasible_set(num_models, concurrency, EXHAUSTIVE_LIMIT)
    if whole is not None:
        run(whole)
        return trials, ""
    run([b for b in start if feasible(b, concurrency)] or [(1,) * num_models])
    best = max(trials.values(), key=objective.rank).thresholds
    steps = [max(1, round(concurrency / 4))] * num_models
    while clock() - t0 <= budget_s:
        run([c for c in neighbours(best, steps, concurrency) if c not in trials])
        top = max(trials.values(), key=objective.rank).thresholds
        if objective.rank(trials[top]) > objective.rank(trials[best]):
            best = top
            continue
        if all(s == 1 for s in steps):
            return trials, ""
        steps = [max(1, s // 2) for s in steps]
    return trials, f"stopped at the time budget of {budget_s:g} s after {len(trials)} simulated B"


def finalists(scouted: dict[B, Trial], objective: Objective, k: int = FINALISTS) -> list[B]:
    """The `k` best scouted B by `objective`, best first."""
    return [t.thresholds for t in sorted(scouted.values(), key=objective.rank, reverse=True)[:k]]


def choose(trials: dict[B, Trial], objective: Objective) -> B | None:
    """The best B of `trials` by `objective` (None: none meets the SLO); on a tie the first simulated."""
    best = max(trials.values(), key=objective.rank)
    return best.thresholds if objective.meets(best) else None


# -- the simulator as the judge ----------------------------------------------------------------------------------


def trial_requests(concurrency: int) -> int:
    """Requests of one trial: about three generations of N clients, and at least 24."""
    return max(24, 3 * concurrency)


def trial_config(cfg: SimConfig, concurrency: int, requests: int | None = None) -> SimConfig:
    """`cfg` as a trial at N: a closed loop of N clients (no arrival rate, phases or autotune: not what B is chosen
    for), `requests` requests (default `trial_requests(N)`; at least N + 1), stopped when the loop runs out."""
    policy = dataclasses.replace(cfg.deployment.policy, autotune=None)
    dep = dataclasses.replace(cfg.deployment, policy=policy)
    reqs = max(concurrency + 1, requests or trial_requests(concurrency))
    return dataclasses.replace(cfg, deployment=dep, concurrency=concurrency, num_requests=reqs, arrival_rate=None,
                               trial=True)  # fmt: skip


def scout_requests(concurrency: int) -> int:
    """Requests of one scouting trial: half of `trial_requests`, so the loop runs out when about half the clients
    finished their first request (in the study, such trials ranked B as the full ones do: Spearman 0.99+)."""
    return max(12, trial_requests(concurrency) // 2)


def run_trial(cfg: SimConfig, thresholds: B) -> Trial:
    """One candidate simulated as a trial (`cfg` from `trial_config`); top-level, for a process pool."""
    dep = cfg.deployment
    policy = dep.policy.with_thresholds(thresholds)
    res = simulate_config(dataclasses.replace(cfg, deployment=dataclasses.replace(dep, policy=policy)))
    return trial_of(thresholds, res.summary)


def trial_of(thresholds: B, summary: dict[str, float]) -> Trial:
    """What a run of B measured, as the decider ranks it: steady (else whole-run) tok/s and TPOT p50/p99."""
    tok_s = summary.get("steady_output_throughput_tok_s", summary["output_throughput_tok_s"])
    return Trial(tuple(thresholds), float(tok_s), float(summary["tpot_ms_p50"]), float(summary["tpot_ms_p99"]))


def simulator_evaluate(cfg: SimConfig, pool: Executor | None = None) -> Evaluate:
    """Trials of `cfg` (a trial config), on `pool`'s processes when given."""

    def evaluate(cands: list[B]) -> list[Trial]:
        if pool is None or len(cands) < 2:
            return [run_trial(cfg, b) for b in cands]
        return list(pool.map(run_trial, [cfg] * len(cands), cands))

    return evaluate


def decide(cfg: SimConfig, concurrency: int | None = None, objective: Objective = THROUGHPUT, *,
           budget_s: float = DEFAULT_BUDGET_S, pool: Executor | None = None, proposals: Proposals | None = None,
           start: int = START_CANDIDATES, requests: int | None = None,
           progress: Callable[[int, Trial], None] | None = None, also: Sequence[B] = (), finals: int = FINALISTS,
           judge: Evaluate | None = None) -> Choice:  # fmt: skip
    """B for `cfg`'s deployment at N (default `cfg.concurrency`). `proposals`: the Markov model's, when the caller
    has them; `start`: how many of them start the search; `requests`: per trial (default `trial_requests(N)`);
    `judge`: judges the `finals` best scouted B instead of full trials (`trsim run`: its own runs); `also`: B
    scouted first and judged whatever the scouting found (autotune's B in force, so its gain is like with like)."""
    t0 = time.monotonic()
    n = concurrency or cfg.concurrency
    m = len(cfg.deployment.models)
    if proposals is None:
        proposals = propose(cfg, n)
    first = [*(b for b in also if feasible(b, n)), *(b for b, _ in proposals.ranked[:start])]
    scouting = trial_config(cfg, n, requests // 2 if requests else scout_requests(n))
    scouted, note = scout(simulator_evaluate(scouting, pool), first, n, m, objective, budget_s, progress=progress)
    best = finalists(scouted, objective, finals)
    judged_b = list(dict.fromkeys([*best, *(b for b in also if feasible(b, n))]))
    evaluate = judge or simulator_evaluate(trial_config(cfg, n, requests), pool)
    judged = {t.thresholds: t for t in evaluate(judged_b)}
    return Choice(n, choose(judged, objective), judged, proposals.ranked, objective, note, time.monotonic() - t0,
                  proposals.note, scouted)  # fmt: skip
