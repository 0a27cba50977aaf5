"""Markov-chain throughput model of delayed batching: the definition, T(B), completions and the assumptions are in
docs/markov.md (TokenRouter paper, appendix D). T(B) is computed on the pre-completion chain of `explore.py`;
feasible B, the guard, the clamp and the check are the core's (`core.policy`), never copies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from tokenrouter.core import policy
from tokenrouter.markov.explore import DEFAULT_MAX_STATES, ExploredChains, explore
from tokenrouter.markov.solve import class_distributions
from tokenrouter.markov.steps import StepQuanta, StepSpec, feasible_thresholds, quantize_steps, quantize_table

_ROW_TOL = 1e-9
Matrix = np.ndarray | Sequence[Sequence[float]]


@dataclass(slots=True)
class ThroughputResult:
    """Long-run metrics of one threshold vector, per-model tuples by model index. `mean_batch`: launched batches'
    mean size (0: never runs); `mean_queue` / `mean_running`: time-average waiting / running requests."""

    thresholds: tuple[int, ...]
    throughput_tok_s: float
    mean_batch: tuple[float, ...]
    busy_fraction: tuple[float, ...]
    mean_queue: tuple[float, ...]
    mean_running: tuple[float, ...]
    batches_per_s: tuple[float, ...]
    n_states: int
    delta_eff_ms: float


@dataclass(slots=True)
class ThresholdSearch:
    """B* = argmax T(B) over the candidates searched (by default the feasible set); `results` lists them in
    lexicographic order."""

    best: tuple[int, ...]
    best_throughput_tok_s: float
    results: list[ThroughputResult]

    def ranked(self) -> list[ThroughputResult]:
        """Results by decreasing throughput, ties by B (lexicographic)."""
        return sorted(self.results, key=lambda res: (-res.throughput_tok_s, res.thresholds))


@dataclass(slots=True)
class MarkovChain:
    """The embedded (pre-completion) chain of one threshold vector, for inspection and tests. Rows of `transition`
    sum to 1; `pi` is stationary; states `k`, `b`, `r` (r in quanta, relative to the completion instant)."""

    transition: sp.csr_matrix
    pi: np.ndarray
    start: int
    k: np.ndarray
    b: np.ndarray
    r: np.ndarray
    result: ThroughputResult


@dataclass(slots=True, frozen=True)
class MarkovModel:
    """Validated model inputs; build with `MarkovModel.create`. `completion`: probability that a committed token is
    its request's last (1 / mean output length; 0: requests never finish)."""

    step: StepQuanta
    routing: np.ndarray
    commit: np.ndarray
    concurrency: int
    completion: float = 0.0

    @classmethod
    def create(cls, step_ms: Sequence[StepSpec], routing: Matrix, commit: Matrix, concurrency: int,
               delta_ms: float = 0.1, mean_output: float | None = None) -> MarkovModel:  # fmt: skip
        """`mean_output`: mean output tokens per request (>= 1); None = requests never finish."""
        p = np.asarray(routing, dtype=float)
        c = np.asarray(commit, dtype=float)
        m = len(step_ms)
        if m < 1 or p.shape != (m, m) or c.shape != (m, m):
            raise ValueError(f"routing and commit must be {m}x{m} for {m} step times, got {p.shape} and {c.shape}")
        if not (np.isfinite(p).all() and (p >= 0).all() and np.allclose(p.sum(axis=1), 1.0, atol=_ROW_TOL)):
            raise ValueError("routing rows must be nonnegative and sum to 1")
        if not (np.isfinite(c).all() and (c >= 0).all()):
            raise ValueError("commit matrix must be nonnegative and finite")
        completion = 0.0
        if mean_output is not None:
            if not (math.isfinite(mean_output) and mean_output >= 1):
                raise ValueError(f"mean output must be at least 1 token, got {mean_output}")
            completion = 1.0 / float(mean_output)
        step = quantize_steps(step_ms, concurrency, delta_ms)
        return cls(step, p / p.sum(axis=1, keepdims=True), c, int(concurrency), completion)

    @property
    def num_models(self) -> int:
        return self.routing.shape[0]

    def check_thresholds(self, thresholds: Sequence[int]) -> tuple[int, ...]:
        """B as M integers that pass the core's check of a policy (`core.policy.check_policy`: every B_i >= 1
        and the deadlock guard at N); raise ValueError otherwise."""
        m = self.num_models
        # The chain needs one integer per model; the core's check lets an empty B mean all 1 and 1.5 pass as 1.
        if len(thresholds) != m:
            raise ValueError(f"need {m} thresholds, got {len(thresholds)}")
        if any(isinstance(x, bool) or int(x) != x for x in thresholds):
            raise ValueError(f"thresholds must be integers, got {tuple(thresholds)}")
        b = tuple(int(x) for x in thresholds)
        policy.check_policy(b, {}, num_models=m, concurrency=self.concurrency)
        return b

    def with_quantum(self, delta_ms: float) -> MarkovModel:
        """The same model on another time grid (coarser = fewer states, larger rounding error)."""
        return replace(self, step=quantize_table(self.step.table_ms, delta_ms))

    def with_concurrency(self, concurrency: int) -> MarkovModel:
        """The same model for N' <= N requests (its step tables are cut to b = 1..N')."""
        if not 1 <= concurrency <= self.concurrency:
            raise ValueError(f"concurrency must be in 1..{self.concurrency}, got {concurrency}")
        step = quantize_table(self.step.table_ms[:, :concurrency], self.step.delta_ms)
        return replace(self, step=step, concurrency=int(concurrency))

    def evaluate(
        self, thresholds: Sequence[Sequence[int]], max_states: int = DEFAULT_MAX_STATES, chunk: int = 256
    ) -> list[ThroughputResult]:
        """Results for several threshold vectors, explored `chunk` at a time (faster than one by one). `max_states`
        caps the states of all together: StateSpaceTooLarge once exploring passes it."""
        results: list[ThroughputResult] = []
        left = max_states
        for lo in range(0, len(thresholds), chunk):
            part = [ch.result for ch in self._chains(thresholds[lo : lo + chunk], left, keep=False)]
            left -= sum(res.n_states for res in part)
            results.extend(part)
        return results

    def throughput(self, thresholds: Sequence[int], max_states: int = DEFAULT_MAX_STATES) -> ThroughputResult:
        return self.evaluate([thresholds], max_states)[0]

    def chain(self, thresholds: Sequence[int], max_states: int = DEFAULT_MAX_STATES) -> MarkovChain:
        return self._chains([thresholds], max_states, keep=True)[0]

    def best_thresholds(self, chunk: int = 256, max_states: int = DEFAULT_MAX_STATES) -> ThresholdSearch:
        """Evaluate the whole feasible set and pick B*; see `search`."""
        return self.search(feasible_thresholds(self.num_models, self.concurrency), max_states, chunk)

    def search(
        self, candidates: Sequence[Sequence[int]], max_states: int = DEFAULT_MAX_STATES, chunk: int = 256
    ) -> ThresholdSearch:
        """The best of `candidates`. Ties (within a relative 1e-9) go to the lexicographically smallest B."""
        results = sorted(self.evaluate(candidates, max_states, chunk), key=lambda res: res.thresholds)
        top = max(res.throughput_tok_s for res in results)
        best = next(res for res in results if res.throughput_tok_s >= top * (1 - 1e-9))
        return ThresholdSearch(best.thresholds, best.throughput_tok_s, results)

    def count_states(
        self, thresholds: Sequence[Sequence[int]], max_states: int = DEFAULT_MAX_STATES, chunk: int = 256
    ) -> int:
        """States of the chains of `thresholds` together, explored but not solved (a cheap size probe);
        StateSpaceTooLarge once the total passes `max_states`."""
        total = 0
        for lo in range(0, len(thresholds), chunk):
            thr = [self.check_thresholds(b) for b in thresholds[lo : lo + chunk]]
            total += len(self._explore(thr, max_states - total).k)
        return total

    def _explore(self, thr: list[tuple[int, ...]], max_states: int) -> ExploredChains:
        commit_mean = (self.commit * self.routing).sum(axis=1)
        # A route committing c tokens ends the request unless none of them was the last: 1 - (1 - q)^c.
        finish = 1.0 - (1.0 - self.completion) ** self.commit if self.completion else None
        return explore(self.step.quanta, self.routing, commit_mean, self.concurrency, np.array(thr), max_states, finish)

    def _chains(self, thresholds: Sequence[Sequence[int]], max_states: int, keep: bool) -> list[MarkovChain]:
        thr = [self.check_thresholds(b) for b in thresholds]
        ex = self._explore(thr, max_states)
        order = np.argsort(ex.src, kind="stable")  # edges grouped by source, hence by block
        src, dst, prob = ex.src[order], ex.dst[order], ex.prob[order]
        edge_off = np.searchsorted(src, ex.offsets)
        out = []
        for g, b in enumerate(thr):
            lo, hi = int(ex.offsets[g]), int(ex.offsets[g + 1])
            e = slice(edge_off[g], edge_off[g + 1])
            n = hi - lo
            t = sp.csr_matrix((prob[e], (src[e] - lo, dst[e] - lo)), shape=(n, n))
            weights = class_distributions(t, int(ex.start[g]) - lo)
            result = self._metrics(b, ex, lo, hi, weights)
            pi = sum(w * p for w, p in weights) if keep else np.empty(0)
            blk = slice(lo, hi)
            out.append(MarkovChain(t, pi, int(ex.start[g]) - lo, ex.k[blk], ex.b[blk], ex.r[blk], result))
        return out

    def _metrics(
        self, b: tuple[int, ...], ex: ExploredChains, lo: int, hi: int, weights: list[tuple[float, np.ndarray]]
    ) -> ThroughputResult:
        """Renewal-reward ratios (reward per unit time) per closed class, mixed by absorption probability."""
        blk = slice(lo, hi)
        rewards = [ex.busy[blk], ex.queue[blk], ex.running[blk], ex.done[blk], ex.done_size[blk]]
        tokens = 0.0
        rates = np.zeros((len(rewards), self.num_models))  # per quantum of time
        for w, pi in weights:
            time = pi @ ex.tau[blk]
            tokens += w * (pi @ ex.tokens[blk]) / time
            rates += w * np.array([pi @ rew for rew in rewards]) / time
        busy, queue, running, done, done_size = rates
        # Mean launched batch = rate of requests completed / rate of batches completed (0 if never launched).
        mean_batch = np.divide(done_size, done, out=np.zeros_like(done), where=done > 0)
        per_s = 1000.0 / self.step.delta_eff_ms  # rates per quantum -> per second

        def tup(x: np.ndarray) -> tuple[float, ...]:
            return tuple(float(v) for v in x)

        return ThroughputResult(
            b,
            float(tokens * per_s),
            tup(mean_batch),
            tup(busy),
            tup(queue),
            tup(running),
            tup(done * per_s),
            n_states=hi - lo,
            delta_eff_ms=self.step.delta_eff_ms,
        )


def throughput(step_ms: Sequence[StepSpec], routing: Matrix, commit: Matrix, thresholds: Sequence[int],
               concurrency: int, delta_ms: float = 0.1,
               mean_output: float | None = None) -> ThroughputResult:  # fmt: skip
    """T(B) and extras for one threshold vector; see the module docstring for the semantics."""
    return MarkovModel.create(step_ms, routing, commit, concurrency, delta_ms, mean_output).throughput(thresholds)
