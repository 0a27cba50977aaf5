"""Autotune: re-solve the delayed-batching thresholds B while serving, from the counters the subservers export
(docs/autotune.md). This module holds the decisions: when to solve (`Solve`, injected: the core does not import the
decider), whether to change B (hysteresis) and whether a change stays (a trial against the old B's measured rate).
Pure and clock-free: the driver passes snapshots and its clock and applies a `Decision` (`Scheduler.set_policy`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenrouter.core.autotune_counters import CounterSnapshot
from tokenrouter.core.autotune_estimate import Estimates, Estimator
from tokenrouter.core.autotune_rates import RateLog, Window
from tokenrouter.core.config import AutotuneConfig
from tokenrouter.core.policy import Policy, format_b

FIRST_SOLVE_GENERATIONS = 2
"""No first solve before this many times N requests finished (`AutotuneController.observe`)."""


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
class Trial:
    """A change under verification: measured from `start` (the change plus settling) for `verify_s`, against
    `baseline` (what the old B measured in the `verify_s` before the change)."""

    decision: Decision
    baseline: Window
    start: float


class AutotuneController:
    """Estimator + solve + hysteresis + trials. The driver calls `observe` every `config.observe_s`, applies a
    returned `Decision` and calls `applied`; `reset` follows an operator's change. `status`, `notices`: for logs."""

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
            # The first requests to finish are the short ones: the trials would serve too short a workload.
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
        """A solve whose change waited (a steady load, the hold time) is decided again, without solving again,
        while its estimates and the B in force still hold."""
        if self._held is None:
            return None
        sol, cur, solved, why = self._held
        if cur != self.current(est.concurrency) or est.moved_from(solved, self.config.tolerance) is not None:
            self._held = None  # what the solve answered no longer applies: the next solve decides
            return None
        return self._take(self._decide(sol, cur, est, now, why))

    def _take(self, decision: Decision | None) -> Decision | None:
        """Keep the solve for `_retry_held` only while its change waits for something that passes (`_waits`)."""
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
        # On the interval only after a drift of half the tolerance (same estimates, same answer).
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
        """The driver applied `decision` on every subserver as `policy` (`PolicyConfig.with_thresholds(new)`:
        flat, as the old table was tuned for the workload that shifted)."""
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
        """A trial for change `d` when the old B was in force over the whole `verify_s` before it (`before`: the
        previous change) and the log reaches back that far."""
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
