"""Autotune: re-solve the delayed-batching thresholds B while serving, from the counters the subservers export.

Workloads shift (the hop rate follows the prompts, the number of live clients moves through the day), so a B
tuned offline for one hop rate and one N is wrong an hour later. `AutotuneController` keeps moving estimates of
what the Markov throughput model needs, re-solves B for the live N and decides whether to change it.

Estimates (`Estimator`): cumulative counters are differenced between snapshots and summed with exponential
decay (a half-life in seconds of the driver's clock), so old windows fade instead of being cut off.
- Hop probability of model i = hops_i / decisions_i. A decision is a sampled token the router routed: committed
  here (`tokens_i`) or handed off. A hand-off that drops the token (R2R's small model: the large model rewrites
  it) is a decision without a token, so decisions_i = tokens_i + hops_i there, and tokens_i on a model whose
  hand-off keeps its token (`drops_token[i]` False). Row counts would be the wrong denominator: prefill chunks
  and rows prepared under overlap for a request that then left are rows without a decision.
- Step time L_i(b) = a_i + c_i * b: a line fitted by weighted least squares to per-batch-size buckets
  (`BatchTimes`: exact sizes up to 16, then coarser) of each step's own busy time, as measured, so co-location
  with the peer and the workload's context lengths are in it. Buckets, not a fit over windows of total
  steps and rows: under one B the windows' mean batch sizes barely differ, so such a fit is ill-conditioned,
  while buckets give one point per batch size the model ran. A line, not the bucket means themselves: the
  Markov model needs L at every b <= N, including sizes the B in force never runs (a large model held at
  B = 7 runs only 7..N), and the line extrapolates. With one batch size observed the slope is 0 (a flat
  step: a weight-bound decode on a GPU at small batches).
- Mean output length = output tokens / requests finished.
- Live N = the median of the live counts sampled over the last half-life (a closed loop dips below N for a
  moment at each finish; a median ignores that and follows a ramp within half a half-life).

Solve: an injected callable (`Solve`; the decider on the measured step times in `tokenrouter.sim.autotune_solve`,
the simulator, which the core does not import) that returns B* with its predicted throughput and the predicted
throughput of the B in force, under the same estimates.

Hysteresis: a new B is applied only when it is predicted to gain at least `min_gain` over the B in force and the
last change is at least `hold_s` old. Two near-equal B therefore never alternate, and a shift of the workload
changes B once (after it, the new B is the best and nothing gains).

Verification: the solve can rank two B wrongly (its step times are a line fitted to what was measured, its trials a
few simulated seconds), and a wrong change under a stable workload would cost for as long as the workload stays. So
a change is a trial: for `verify_s` after it (and two observations of settling) what serving does is measured
(`RateLog.window`: committed-token rate, hop probabilities, live N) against the same for the old B in the `verify_s`
before it. When the new B measured slower by more than `verify_margin` and both windows served one workload
(`Window.same_workload`), the controller reverts (a `Decision` with `revert`) and will not pick that B again until
the estimates move. When the workload moved across the windows, or the old B had not run `verify_s` before the
change (start-up, right after another change), the two are not comparable and the change stays (the model is the
only guide then).

Pure and clock-free: the driver passes snapshots and its clock (`observe(snapshot, now)`), runs the controller
where a solve does not stall serving (the simulator: between events; the runtime: a worker thread of the
front-end process), applies a `Decision` as an operator's change is applied (`Scheduler.set_policy` on every
subserver, between steps) and reports it back (`applied`).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenrouter.core.config import AutotuneConfig
from tokenrouter.core.policy import Policy, format_b

BATCH_BUCKETS: tuple[int, ...] = (*range(1, 17), 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Upper bounds of the batch-size buckets of the step-time counters (bucket k holds sizes in
(BATCH_BUCKETS[k-1], BATCH_BUCKETS[k]]); one more bucket holds every larger batch."""
NUM_BATCH_BUCKETS = len(BATCH_BUCKETS) + 1
MIN_BUCKET_STEPS = 2.0  # a bucket with fewer (decayed) steps is too noisy to anchor the line
FIRST_SOLVE_GENERATIONS = 2
"""No first solve before this many times N requests finished (`AutotuneController.observe`)."""
RECENT_OUTPUTS = 256
"""Finished requests whose output lengths a snapshot carries: the solve's trials replay them (their shape, not only
their mean, decides which of two near-equal B is faster)."""


def batch_bucket(rows: int) -> int:
    """The bucket of a step of `rows` rows."""
    return bisect_left(BATCH_BUCKETS, max(1, int(rows)))


@dataclass(slots=True)
class BatchTimes:
    """Cumulative step counters per batch-size bucket (`batch_bucket`): steps, their rows, and their own busy
    time in ms. A step's own time is the part of the model's timeline it alone accounts for: from its launch, or
    from the end of the step before it if that ended later (overlap: two steps in flight), to its end. Summed
    over the buckets it is the model's busy time (the union of the steps' intervals)."""

    steps: list[int] = field(default_factory=lambda: [0] * NUM_BATCH_BUCKETS)
    rows: list[int] = field(default_factory=lambda: [0] * NUM_BATCH_BUCKETS)
    ms: list[float] = field(default_factory=lambda: [0.0] * NUM_BATCH_BUCKETS)

    def add(self, rows: int, ms: float) -> None:
        k = batch_bucket(rows)
        self.steps[k] += 1
        self.rows[k] += int(rows)
        self.ms[k] += float(ms)


@dataclass(slots=True, frozen=True)
class ModelCounters:
    """One model's cumulative counters at a snapshot: committed tokens it wrote, hand-offs it sent (not finish
    notices), and its `BatchTimes` lists (empty when the sender has none: an older subserver)."""

    tokens: int = 0
    hops: int = 0
    batch_steps: tuple[int, ...] = ()
    batch_rows: tuple[int, ...] = ()
    batch_ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, tokens: int, hops: int, batches: BatchTimes) -> ModelCounters:
        return cls(tokens, hops, tuple(batches.steps), tuple(batches.rows), tuple(batches.ms))


@dataclass(slots=True, frozen=True)
class CounterSnapshot:
    """What the controller reads at one instant: every model's counters (index = model), the live request count
    N the entry holds, and the requests finished so far with their output tokens (cumulative)."""

    models: tuple[ModelCounters, ...]
    live: int
    finished: int = 0
    finished_tokens: int = 0
    finished_tokens_sq: int = 0  # sum of squared output lengths (their spread)
    recent_outputs: tuple[int, ...] = ()  # the output lengths of the last `RECENT_OUTPUTS` finished, newest last


@dataclass(slots=True, frozen=True)
class StepLine:
    """L(b) = intercept_ms + per_row_ms * b, never below `floor_ms` (half the fastest bucket's mean: a line
    extrapolated below the data must not reach 0). `sizes`: the smallest and largest mean batch sizes seen."""

    intercept_ms: float
    per_row_ms: float
    floor_ms: float
    sizes: tuple[float, float]

    def at(self, b: float) -> float:
        return max(self.floor_ms, self.intercept_ms + self.per_row_ms * b)


def fit_step_line(points: Sequence[tuple[float, float, float]]) -> StepLine | None:
    """Weighted least squares of ms on rows over (mean rows, mean ms, weight) points, with both coefficients >= 0:
    a step never gets faster with more rows (a negative slope is noise), and a step of no rows costs no less than
    nothing (a negative intercept, which a convex curve's chord through large batches gives, would price a small
    batch below zero: the line then goes through the origin). None without points."""
    pts = [(r, m, w) for r, m, w in points if w > 0]
    if not pts:
        return None
    wsum = sum(w for _, _, w in pts)
    r_bar = sum(r * w for r, _, w in pts) / wsum
    m_bar = sum(m * w for _, m, w in pts) / wsum
    var = sum(w * (r - r_bar) ** 2 for r, _, w in pts)
    slope = sum(w * (r - r_bar) * (m - m_bar) for r, m, w in pts) / var if var > 1e-12 * wsum else 0.0
    slope = max(0.0, slope)
    intercept = m_bar - slope * r_bar
    if intercept < 0.0:  # the constrained optimum lies on a = 0: least squares through the origin
        intercept, slope = 0.0, sum(w * r * m for r, m, w in pts) / sum(w * r * r for r, _, w in pts)
    floor = 0.5 * min(m for _, m, _ in pts)
    sizes = (min(r for r, _, _ in pts), max(r for r, _, _ in pts))
    return StepLine(intercept, slope, floor, sizes)


@dataclass(slots=True, frozen=True)
class Estimates:
    """What the solve needs, as estimated: live N, hop probability per model (None: the model routed nothing yet),
    step-time line per model (None: it ran no step yet) and the (mean rows, mean ms, weight) points it was fitted
    to, mean output length (None: nothing finished yet) and the outputs' lognormal spread sigma (None: unknown)."""

    concurrency: int
    hop_prob: tuple[float | None, ...]
    step: tuple[StepLine | None, ...]
    mean_output: float | None
    step_points: tuple[tuple[tuple[float, float, float], ...], ...] = ()
    output_sigma: float | None = None
    outputs: tuple[int, ...] = ()  # recent output lengths, newest last (`CounterSnapshot.recent_outputs`)

    def step_table(self, concurrency: int | None = None) -> list[list[float]]:
        """L_i(b) in ms for b = 1..N, one list per model; ValueError if a model has no step estimate."""
        n = concurrency or self.concurrency
        if any(s is None for s in self.step):
            raise ValueError("no step-time estimate for every model yet")
        return [[s.at(b) for b in range(1, n + 1)] for s in self.step]  # type: ignore[union-attr]

    def moved_from(self, old: Estimates, tolerance: float) -> str | None:
        """What moved by more than `tolerance` (relative) since `old`, or None."""
        moved = self.workload_moved_from(old, tolerance)
        if moved is not None:
            return moved
        for i, (s, t) in enumerate(zip(self.step, old.step, strict=True)):
            if (s is None) != (t is None):
                return f"step time of model {i}"
            if s is not None and t is not None:
                b = max(1.0, sum(t.sizes) / 2)
                if abs(s.at(b) - t.at(b)) > tolerance * t.at(b):
                    return f"step time of model {i}"
        a, b = self.mean_output, old.mean_output
        if (a is None) != (b is None) or (a is not None and abs(a - b) > tolerance * b):  # type: ignore[operator]
            return "mean output length"
        return None

    def workload_moved_from(self, old: Estimates, tolerance: float) -> str | None:
        """What of the workload (N, hop probabilities) moved by more than `tolerance` since `old`, or None. Step
        times are left out: they move with B itself (batch sizes, co-location), so they cannot tell whether two
        B were measured under one workload. The mean output is left out too: its estimate is the noisiest, and
        it moves a closed loop's rate little."""
        if self.concurrency != old.concurrency:
            return f"N {old.concurrency} -> {self.concurrency}"
        for i, (p, q) in enumerate(zip(self.hop_prob, old.hop_prob, strict=True)):
            if (p is None) != (q is None) or (p is not None and abs(p - q) > tolerance * max(q, 0.01)):  # type: ignore[operator]
                return f"hop probability of model {i}"
        return None

    def describe(self) -> str:
        hop = "/".join("-" if p is None else f"{p:.3f}" for p in self.hop_prob)
        step = " / ".join("-" if s is None else f"{s.intercept_ms:.2f}+{s.per_row_ms:.3f}b" for s in self.step)
        out = "-" if self.mean_output is None else f"{self.mean_output:.0f}"
        return f"N={self.concurrency}, hop {hop}, step ms {step}, mean output {out}"

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "hop_prob": list(self.hop_prob),
            "step_intercept_ms": [None if s is None else s.intercept_ms for s in self.step],
            "step_per_row_ms": [None if s is None else s.per_row_ms for s in self.step],
            "mean_output": self.mean_output,
        }


class Estimator:
    """Moving estimates from cumulative counter snapshots (module docstring). `drops_token[i]`: model i's
    hand-off drops the token it sampled (its hop is a decision without a committed token)."""

    def __init__(self, drops_token: Sequence[bool], half_life_s: float, step_half_life_s: float) -> None:
        if half_life_s <= 0 or step_half_life_s <= 0:
            raise ValueError("half-lives must be > 0")
        self.drops = tuple(bool(d) for d in drops_token)
        self.half_life_s, self.step_half_life_s = float(half_life_s), float(step_half_life_s)
        m = len(self.drops)
        self.tokens, self.hops = [0.0] * m, [0.0] * m
        self.b_steps = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.b_rows = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.b_ms = [[0.0] * NUM_BATCH_BUCKETS for _ in range(m)]
        self.finished = self.finished_tokens = self.finished_tokens_sq = 0.0
        self.outputs: tuple[int, ...] = ()
        self.live: deque[tuple[float, int]] = deque()
        self._last: CounterSnapshot | None = None
        self._last_t: float | None = None

    @property
    def num_models(self) -> int:
        return len(self.drops)

    def update(self, snap: CounterSnapshot, now: float) -> None:
        """Fold in the counters' change since the previous snapshot. Counters that went backwards (a restarted
        subserver starts again at 0) make that snapshot the new baseline for the model, adding nothing."""
        if len(snap.models) != self.num_models:
            raise ValueError(f"snapshot has {len(snap.models)} models, expected {self.num_models}")
        self.live.append((now, int(snap.live)))
        while len(self.live) > 1 and self.live[0][0] < now - self.half_life_s:
            self.live.popleft()
        prev, t0 = self._last, self._last_t
        self._last, self._last_t = snap, now
        if prev is None or t0 is None or now <= t0:
            return
        fast = 0.5 ** ((now - t0) / self.half_life_s)
        slow = 0.5 ** ((now - t0) / self.step_half_life_s)
        for i, (c, p) in enumerate(zip(snap.models, prev.models, strict=True)):
            d_steps = _diff(c.batch_steps, p.batch_steps)
            d_rows = _diff(c.batch_rows, p.batch_rows)
            d_ms = _diff(c.batch_ms, p.batch_ms)
            d_tok, d_hop = c.tokens - p.tokens, c.hops - p.hops
            if d_steps is None or d_rows is None or d_ms is None or d_tok < 0 or d_hop < 0:
                continue  # a restart: this snapshot is the baseline
            self.tokens[i] = self.tokens[i] * fast + d_tok
            self.hops[i] = self.hops[i] * fast + d_hop
            for k in range(NUM_BATCH_BUCKETS):
                self.b_steps[i][k] = self.b_steps[i][k] * slow + d_steps[k]
                self.b_rows[i][k] = self.b_rows[i][k] * slow + d_rows[k]
                self.b_ms[i][k] = self.b_ms[i][k] * slow + d_ms[k]
        d_fin, d_fin_tok = snap.finished - prev.finished, snap.finished_tokens - prev.finished_tokens
        if snap.recent_outputs:
            self.outputs = tuple(snap.recent_outputs)
        d_fin_sq = snap.finished_tokens_sq - prev.finished_tokens_sq
        if d_fin >= 0 and d_fin_tok >= 0 and d_fin_sq >= 0:
            self.finished = self.finished * slow + d_fin
            self.finished_tokens = self.finished_tokens * slow + d_fin_tok
            self.finished_tokens_sq = self.finished_tokens_sq * slow + d_fin_sq

    def idle(self) -> bool:
        """No live request in most of the samples of the last half-life (nothing to tune for)."""
        return not self.live or statistics.median(n for _, n in self.live) < 0.5

    def steps(self, model: int) -> float:
        """Decayed step count of `model` (the weight behind its step-time line)."""
        return sum(self.b_steps[model])

    def decisions(self, model: int) -> float:
        return self.tokens[model] + (self.hops[model] if self.drops[model] else 0.0)

    def estimates(self) -> Estimates:
        hop: list[float | None] = []
        lines: list[StepLine | None] = []
        points = []
        for i in range(self.num_models):
            d = self.decisions(i)
            hop.append(min(1.0, self.hops[i] / d) if d > 0 else None)
            pts = [(self.b_rows[i][k] / s, self.b_ms[i][k] / s, s) for k, s in enumerate(self.b_steps[i]) if s > 0]
            # Young counters (no bucket with MIN_BUCKET_STEPS yet): every bucket, however few its steps.
            used = [p for p in pts if p[2] >= MIN_BUCKET_STEPS] or pts
            lines.append(fit_step_line(used))
            points.append(tuple(used))
        live = [n for _, n in self.live]
        n = max(1, round(statistics.median(live))) if live else 1
        mean_out = sigma = None
        if self.finished >= 1.0:
            mean_out = max(1.0, self.finished_tokens / self.finished)
            second = self.finished_tokens_sq / self.finished
            # lognormal: E[X^2] / E[X]^2 = exp(sigma^2)
            sigma = math.sqrt(max(0.0, math.log(max(1.0, second / mean_out**2)))) if second > 0 else None
        return Estimates(n, tuple(hop), tuple(lines), mean_out, tuple(points), sigma, self.outputs)


def _diff(cur: Sequence[float], prev: Sequence[float]) -> list[float] | None:
    """Element-wise cur - prev over NUM_BATCH_BUCKETS (missing entries are 0); None if any went backwards."""
    out = []
    for k in range(NUM_BATCH_BUCKETS):
        d = (cur[k] if k < len(cur) else 0) - (prev[k] if k < len(prev) else 0)
        if d < 0:
            return None
        out.append(d)
    return out


@dataclass(slots=True, frozen=True)
class Solution:
    """A solve's answer under one set of estimates: B* and its predicted throughput, the predicted throughput of
    the B in force (`current_tok_s`; None when it could not be evaluated), and what the search reduced (`note`)."""

    thresholds: tuple[int, ...]
    throughput_tok_s: float | None
    current_tok_s: float | None
    note: str = ""


Solve = Callable[[Estimates, tuple[int, ...]], Solution]
"""(estimates, B in force for the estimated N) -> Solution. Must be time-boxed (a state budget)."""


@dataclass(slots=True, frozen=True)
class Decision:
    """Change B from `old` to `new` at `at` (the driver's clock): what the estimates were, and the predicted
    relative gain and throughput of `new`."""

    at: float
    old: tuple[int, ...]
    new: tuple[int, ...]
    estimates: Estimates
    predicted_gain: float
    predicted_tok_s: float
    note: str = ""
    revert: bool = False  # a change that measured slower, undone: `predicted_*` are then the measured rates

    def describe(self) -> str:
        b = format_b
        what = "revert, measured" if self.revert else "predicted"
        return (f"B {b(self.old)} -> {b(self.new)} ({what} {self.predicted_gain:+.1%}, "
                f"{self.predicted_tok_s:,.1f} tok/s) at {self.estimates.describe()}")  # fmt: skip

    def as_dict(self) -> dict[str, object]:
        return {"at": self.at, "old": list(self.old), "new": list(self.new), "predicted_gain": self.predicted_gain,
                "predicted_tok_s": self.predicted_tok_s, "estimates": self.estimates.as_dict(),
                "revert": self.revert}  # fmt: skip


@dataclass(slots=True, frozen=True)
class Window:
    """What one stretch of serving measured on its own: the committed-token rate, each model's hop probability
    (hand-offs over decisions in the window; None where it decided nothing), the median live count, and whether
    the live count held (`steady`: every sample within one request, or 10%, of the median; a closed loop dips by
    one for a moment at each finish, a ramp leaves samples far from it)."""

    tok_s: float
    hop_prob: tuple[float | None, ...]
    live: float
    steady: bool = True

    def same_workload(self, other: Window, tolerance: float) -> bool:
        """The two windows served one workload: the same median N, hop probabilities within `tolerance` (relative
        to the larger of the probability and 0.1). Each window's own values, not the decayed estimates: those lag
        a shift by a half-life, so a window on each side of one could look alike."""
        if self.live != other.live or not (self.steady and other.steady):
            return False
        for p, q in zip(self.hop_prob, other.hop_prob, strict=True):
            if (p is None) != (q is None) or (p is not None and abs(p - q) > tolerance * max(q, 0.1)):  # type: ignore[operator]
                return False
        return True


class RateLog:
    """Recent snapshots as (time, committed tokens, per-model hand-offs, per-model decisions, live count), for what a
    window of serving measured (`window`). Tokens that went backwards (a restarted subserver) start it again."""

    def __init__(self, keep_s: float, drops_token: Sequence[bool]) -> None:
        self.keep_s = keep_s
        self.drops = tuple(drops_token)
        self.points: deque[tuple[float, int, tuple[int, ...], tuple[int, ...], int]] = deque()

    def add(self, now: float, snap: CounterSnapshot) -> None:
        tokens = sum(m.tokens for m in snap.models)
        if self.points and tokens < self.points[-1][1]:
            self.points.clear()
        hops = tuple(m.hops for m in snap.models)
        decisions = tuple(m.tokens + (m.hops if d else 0) for m, d in zip(snap.models, self.drops, strict=True))
        self.points.append((now, tokens, hops, decisions, int(snap.live)))
        while len(self.points) > 2 and self.points[1][0] < now - self.keep_s:
            self.points.popleft()

    def _index_at_or_before(self, t: float) -> int | None:
        best = None
        for k, p in enumerate(self.points):
            if p[0] > t:
                break
            best = k
        return best

    def window(self, a: float, b: float) -> Window | None:
        """[a, b] as measured between the last snapshots at or before each end; None when the log does not reach
        back to `a` or the span is under half of [a, b]."""
        i, j = self._index_at_or_before(a), self._index_at_or_before(b)
        if i is None or j is None:
            return None
        p0, p1 = self.points[i], self.points[j]
        if p1[0] <= p0[0] or p1[0] - p0[0] < 0.5 * (b - a):
            return None
        hop = tuple((h1 - h0) / (d1 - d0) if d1 > d0 else None
                    for h0, h1, d0, d1 in zip(p0[2], p1[2], p0[3], p1[3], strict=True))  # fmt: skip
        live = [p[4] for k, p in enumerate(self.points) if i < k <= j]
        mid = float(statistics.median(live))
        steady = all(abs(n - mid) <= max(1.0, 0.1 * mid) for n in live)
        return Window((p1[1] - p0[1]) / (p1[0] - p0[0]), hop, mid, steady)


@dataclass(slots=True, frozen=True)
class Trial:
    """A change under verification: measured from `start` (the change plus settling) for `verify_s`, against
    `baseline` (what the old B measured in the `verify_s` before the change)."""

    decision: Decision
    baseline: Window
    start: float


class AutotuneController:
    """Estimator + solve + hysteresis (module docstring). The driver calls `observe` every `config.observe_s` with
    a fresh snapshot; a returned `Decision` is applied by the driver, which then calls `applied(decision, policy)`
    (not applied: it does not call it, and the controller keeps the old B). `reset(policy, now)` records a change
    made by someone else (an operator through the admin endpoint).

    `status`: one line on what the last `observe` did (waiting for data, solved and held, ...), for logs;
    `notices`: warnings worth one log line each (a load that never holds steady: open-loop arrivals).

    A change waits for a load it can be verified against: with `verify_s` > 0 and the live count not steady over the
    last `verify_s` (an open loop's count wanders; a closed loop's holds but for a moment at each finish), no B
    changes until it is (at start-up, before the log reaches back `verify_s`, a change goes unverified)."""

    def __init__(self, config: AutotuneConfig, policy: Policy, solve: Solve, drops_token: Sequence[bool]) -> None:
        if policy.is_sync:
            raise ValueError(f"autotune changes delayed-batching thresholds, not a {policy.kind.value} policy")
        self.config = config
        self.policy = policy
        self.solve = solve
        self.estimator = Estimator(drops_token, config.half_life_s, config.step_half_life_s)
        self.num_models = len(drops_token)
        self.solves = 0
        self.changes = 0
        self.history: list[Decision] = []
        self.estimates: Estimates | None = None
        self.status = "waiting for counters"
        self._solved: Estimates | None = None  # the estimates of the last solve
        self._solved_at: float | None = None
        self._changed_at: float | None = None
        self.reverts = 0
        self.trial: Trial | None = None
        self.rejected: dict[tuple[int, ...], Estimates] = {}  # B measured slower, and the estimates it was under
        self.rates = RateLog(2 * config.verify_s + 4 * config.observe_s, drops_token)
        self.notices: list[str] = []  # one-time messages for the driver to log (it takes them: `notices.clear()`)
        self._held: tuple[Solution, tuple[int, ...], Estimates, str] | None = None  # a solve whose change waits
        self._waits = False
        self._noticed: set[str] = set()

    def current(self, concurrency: int) -> tuple[int, ...]:
        """The B in force for `concurrency`, as every subserver derives it (eager = all 1; clamped)."""
        return self.policy.thresholds_for(concurrency, self.num_models)

    def observe(self, snap: CounterSnapshot, now: float) -> Decision | None:
        """Update the estimates; end a trial that is due (a revert, or nothing); re-solve when due; a Decision when
        a new B passes the hysteresis."""
        self.estimator.update(snap, now)
        short = [i for i in range(self.num_models) if self.estimator.steps(i) < self.config.min_steps]
        if short:
            self.rates.add(now, snap)
            self.status = f"waiting: model {short[0]} ran {self.estimator.steps(short[0]):.0f} of " \
                          f"{self.config.min_steps} steps"  # fmt: skip
            return None
        if self._solved is None and snap.finished < FIRST_SOLVE_GENERATIONS * max(1, snap.live):
            # The first requests to finish are the short ones: outputs measured before two generations finished
            # would have the trials serve a workload shorter than the one that runs.
            self.rates.add(now, snap)
            self.status = f"waiting: {snap.finished} of {FIRST_SOLVE_GENERATIONS * max(1, snap.live)} requests " \
                          "finished (two generations of N) before the first solve"  # fmt: skip
            return None
        idle = self.estimator.idle()
        est = None if idle else self.estimator.estimates()
        self.rates.add(now, snap)
        if est is None:
            self.trial = None  # nothing to measure a B by
            self.status = "idle: no live requests"
            return None
        self.estimates = est
        if self.trial is not None:
            if now < self.trial.start + self.config.verify_s:
                self.status = f"verifying B {format_b(self.trial.decision.new)}: " \
                              f"{self.trial.start + self.config.verify_s - now:.0f} s left"  # fmt: skip
                return None  # the trial is under way: no other change meanwhile
            revert = self._end_trial(est, now)
            if revert is not None:
                return revert
        why = self._due(est, now)
        if why is None:
            return self._retry_held(est, now)
        cur = self.current(est.concurrency)
        self._solved, self._solved_at = est, now
        try:
            sol = self.solve(est, cur)
        except Exception as e:  # a failed solve keeps B; serving must not stop for it
            self.status = f"solve failed ({why}): {type(e).__name__}: {e}"
            return None
        self.solves += 1
        self._held = (sol, cur, est, why)
        return self._take(self._decide(sol, cur, est, now, why))

    def _retry_held(self, est: Estimates, now: float) -> Decision | None:
        """A solve whose change waited (a steady load to verify against, the hold time) is decided again, without
        solving again, while its estimates and the B in force still hold: the wait ends with the change."""
        if self._held is None:
            return None
        sol, cur, solved, why = self._held
        if cur != self.current(est.concurrency) or est.moved_from(solved, self.config.tolerance) is not None:
            self._held = None  # what the solve answered no longer applies: the next solve decides
            return None
        return self._take(self._decide(sol, cur, est, now, why))

    def _take(self, decision: Decision | None) -> Decision | None:
        """Keep the solve for `_retry_held` only when its change waits for something that passes (`_decide` set
        `_waits`: the hold time, a steady load); a decision, or a solve that keeps B, ends it."""
        if decision is not None or not self._waits:
            self._held = None
        return decision

    def _due(self, est: Estimates, now: float) -> str | None:
        if self._solved is None or self._solved_at is None:
            return "first solve"
        since = now - self._solved_at
        moved = est.moved_from(self._solved, self.config.tolerance)
        # Estimates that keep drifting (a shift under way) re-solve at most four times per interval.
        if moved is not None and since >= self.config.interval_s / 4:
            return f"moved: {moved}"
        # A solve is a few simulations: on the interval only for a drift of half the tolerance (same estimates,
        # same answer).
        drift = est.moved_from(self._solved, self.config.tolerance / 2)
        if since >= self.config.interval_s and drift is not None:
            return f"interval, {drift} drifted"
        return None

    def _end_trial(self, est: Estimates, now: float) -> Decision | None:
        """The trial's verdict: a revert when the new B measured slower under unchanged estimates, else None."""
        t, self.trial = self.trial, None
        assert t is not None
        d = t.decision
        b = format_b
        w, base = self.rates.window(t.start, now), t.baseline
        if w is None or not w.same_workload(base, self.config.tolerance):
            self.status = f"kept B {b(d.new)} unverified ({'no measurement' if w is None else 'the workload moved'})"
            return None
        if w.tok_s >= base.tok_s * (1.0 - self.config.verify_margin):
            self.status = f"kept B {b(d.new)}: measured {w.tok_s:,.0f} tok/s against {base.tok_s:,.0f} under B " \
                          f"{b(d.old)}"  # fmt: skip
            return None
        self.status = f"revert B {b(d.new)} -> {b(d.old)}: measured {w.tok_s:,.0f} tok/s against {base.tok_s:,.0f}"
        note = f"B {b(d.new)} measured {w.tok_s:,.1f} tok/s against {base.tok_s:,.1f} under B {b(d.old)} before it"
        return Decision(now, d.new, d.old, est, base.tok_s / max(w.tok_s, 1e-9) - 1.0, base.tok_s, note,
                        revert=True)  # fmt: skip

    def _decide(self, sol: Solution, cur: tuple[int, ...], est: Estimates, now: float, why: str) -> Decision | None:
        b = format_b
        self._waits = False
        if sol.thresholds == cur:
            self.status = f"solved ({why}): B {b(cur)} in force is the best"
            return None
        seen = self.rejected.get(tuple(sol.thresholds))
        if seen is not None:
            if est.workload_moved_from(seen, self.config.tolerance) is None:
                self.status = f"solved ({why}): B {b(sol.thresholds)} measured slower than B {b(cur)} here: hold"
                return None
            del self.rejected[tuple(sol.thresholds)]  # the workload moved since: the model may be right now
        if sol.throughput_tok_s is None or not sol.current_tok_s or sol.current_tok_s <= 0:
            self.status = f"solved ({why}): no prediction to compare B {b(sol.thresholds)} with B {b(cur)}"
            return None
        gain = sol.throughput_tok_s / sol.current_tok_s - 1.0
        if gain < self.config.min_gain:
            self.status = f"solved ({why}): B {b(sol.thresholds)} gains {gain:+.1%} < {self.config.min_gain:.1%}: hold"
            return None
        if self._changed_at is not None and now - self._changed_at < self.config.hold_s:
            self.status = f"solved ({why}): B {b(sol.thresholds)} gains {gain:+.1%}, but the last change is " \
                          f"{now - self._changed_at:.1f} s old (< {self.config.hold_s:g} s): hold"  # fmt: skip
            self._waits = True
            return None
        v = self.config.verify_s
        base = self.rates.window(now - v, now) if v > 0 else None
        if base is not None and not base.steady:
            self.status = f"solved ({why}): B {b(sol.thresholds)} gains {gain:+.1%}, held: the live count moved " \
                          f"within the last {v:g} s, so the change could not be measured"  # fmt: skip
            self._notice("unsteady", f"autotune: the live request count keeps moving (open-loop arrivals?); a B "
                         f"change waits for {v:g} s of steady load, against which it can be verified")  # fmt: skip
            self._waits = True
            return None
        self.status = f"solved ({why}): change B {b(cur)} -> {b(sol.thresholds)} ({gain:+.1%})"
        return Decision(now, cur, tuple(sol.thresholds), est, gain, float(sol.throughput_tok_s), sol.note)

    def _notice(self, key: str, text: str) -> None:
        """A one-time message for the driver's log (`notices`), once per kind."""
        if key not in self._noticed:
            self._noticed.add(key)
            self.notices.append(text)

    def applied(self, decision: Decision, policy: Policy) -> None:
        """The driver applied `decision` on every subserver as `policy` (`PolicyConfig.with_thresholds(new)`, built:
        flat, a table of the old policy was tuned for the workload that shifted), in force from now on."""
        before = self._changed_at
        self.policy = policy
        self.changes += 1
        self._changed_at = decision.at
        self.history.append(decision)
        if decision.revert:
            self.reverts += 1
            self.rejected[tuple(decision.old)] = decision.estimates
            return
        self.trial = self._trial_of(decision, before)

    def _trial_of(self, d: Decision, before: float | None) -> Trial | None:
        """A trial for change `d` when what the old B did over the `verify_s` before it is measurable: the old B was
        in force all that window (`before`: the previous change) and the log reaches back to its start."""
        v = self.config.verify_s
        if v <= 0 or (before is not None and before > d.at - v):
            return None
        base = self.rates.window(d.at - v, d.at)
        if base is None or base.tok_s <= 0:
            return None
        return Trial(d, base, d.at + 2 * self.config.observe_s)

    def reset(self, policy: Policy, now: float) -> None:
        """Someone else changed the policy (the admin endpoint): follow it, hold for `hold_s`, re-solve soon."""
        if policy.is_sync:
            raise ValueError(f"autotune cannot follow a {policy.kind.value} policy")
        self.policy = policy
        self._changed_at = now
        self._solved = None
        self.trial = None  # the operator's B is not autotune's to verify, nor what it measured before
        self.rejected.clear()
