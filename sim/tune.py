"""Threshold tuning: B per concurrency from the decider (`sim.decide`; docs/simulator.md#choosing-b)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.calibration.gpus import usd_per_mtok
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, TuneObjective
from tokenrouter.sim.decide import DEFAULT_BUDGET_S, START_CANDIDATES, THROUGHPUT, Choice, Objective, Trial, decide
from tokenrouter.sim.propose import propose
from tokenrouter.sim.run import SimConfig, SimResult, run_sim


@dataclass(slots=True)
class TunePoint:
    """One N of a tune: the decider's `Choice` there (`sim.decide`)."""

    concurrency: int
    choice: Choice

    @property
    def best(self) -> tuple[int, ...]:
        """The chosen B; where no B met the SLO, the one of lowest TPOT p99 (flagged by `meets_slo`)."""
        c = self.choice
        if c.thresholds is not None:
            return c.thresholds
        return min(c.trials.values(), key=lambda t: t.tpot_p99_ms).thresholds

    @property
    def meets_slo(self) -> bool:
        return self.choice.thresholds is not None

    @property
    def simulated(self) -> dict[tuple[int, ...], float]:
        """Steady tok/s of every B simulated at this N."""
        return {b: t.tok_s for b, t in self.choice.trials.items()}

    @property
    def best_throughput(self) -> float:
        return self.choice.trials[self.best].tok_s

    @property
    def tpot_ms(self) -> tuple[float, float]:
        """TPOT p50, p99 of the simulation at `best`."""
        t = self.choice.trials[self.best]
        return t.tpot_p50_ms, t.tpot_p99_ms

    @property
    def markov(self) -> tuple[tuple[int, ...] | None, float]:
        """The Markov model's B* here and its predicted tok/s (None, nan when it proposed nothing)."""
        ranked = self.choice.markov
        return (ranked[0][0], ranked[0][1]) if ranked else (None, float("nan"))


def with_thresholds(cfg: SimConfig, thresholds: Sequence[int], **policy: Any) -> SimConfig:
    """A new `cfg` delayed at `thresholds` (a config's B(N) table goes), with the `PolicyConfig` fields given."""
    pc = dataclasses.replace(cfg.deployment.policy.with_thresholds(thresholds), **policy)
    return dataclasses.replace(cfg, deployment=dataclasses.replace(cfg.deployment, policy=pc))


def simulate_thresholds(cfg: SimConfig, thresholds: tuple[int, ...]) -> SimResult:
    """A candidate B simulated as it is: delayed, without a B(N) table or autotune (which would override it)."""
    return run_sim(with_thresholds(cfg, thresholds, autotune=None))


def tune_point(cfg: SimConfig, concurrency: int, top: int = START_CANDIDATES, pool: Executor | None = None, *,
               objective: Objective = THROUGHPUT, budget_s: float = DEFAULT_BUDGET_S, requests: int | None = None,
               progress: Callable[[int, Trial], None] | None = None) -> TunePoint:  # fmt: skip
    """B for one concurrency by the decider (`trsim run --thresholds auto`'s search from the Markov model's `top`
    proposals, nothing of another N: docs/simulator.md#choosing-b), with the Markov B* judged beside the finalists."""
    proposals = propose(cfg, concurrency)
    markov = [b for b, _ in proposals.ranked[:1]]  # judged too: the table shows what the choice gains over it
    choice = decide(cfg, concurrency, objective, budget_s=budget_s, pool=pool, start=top, requests=requests,
                    progress=progress, proposals=proposals, also=markov)  # fmt: skip
    return TunePoint(concurrency, choice)


# -- choosing among placements (and SM splits): each candidate with its own tuned B --------------------------------


def at_sustained_load(objective: TuneObjective | str) -> bool:
    """Whether `objective` compares candidates at the load each sustains rather than at one N: cost and tok/s per
    GPU do (at one closed-loop N a two-GPU placement idles by construction); total tok/s stays at `--compare-n`."""
    return TuneObjective(str(objective)) is not TuneObjective.TOTAL


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

    @property
    def first_n(self) -> int:
        """The smallest N tuned."""
        return min(p.concurrency for p in self.points)

    @property
    def slo_tpot_ms(self) -> float | None:
        """The TPOT p99 SLO its points were tuned to (None: none)."""
        return self.points[0].choice.objective.slo_tpot_ms

    @property
    def sustained_n(self) -> int | None:
        """The largest N tuned before the first N whose chosen B misses the SLO (a higher N only raises TPOT, so an N
        tuned past it later does not count); None when it misses at its smallest N."""
        out = None
        for p in sorted(self.points, key=lambda p: p.concurrency):
            if not p.meets_slo:
                break
            out = p.concurrency
        return out

    def priced_n(self, n: int | None) -> int | None:
        """The N it is compared at: `n` when given (one N for every candidate), else `sustained_n`."""
        return self.sustained_n if n is None else n

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


def choose(candidates: list[Candidate], n: int | None, objective: TuneObjective | str) -> Candidate:
    """The candidate with the best objective, each at `n` (None: at its `sustained_n`). One that meets the SLO at
    no N ranks below every one that does (among such, lower TPOT p99 at the smallest N first); on a tie, fewer
    GPUs, then the first listed."""
    order = {id(c): k for k, c in enumerate(candidates)}

    def key(c: Candidate) -> tuple[bool, float, int, int]:
        at = c.priced_n(n)
        value = c.score(at, objective) if at is not None else -c.point(c.first_n).tpot_ms[1]
        return at is not None, value, -c.gpus, -order[id(c)]

    return max(candidates, key=key)
