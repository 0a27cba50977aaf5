"""Autotune's pure controller: the estimator recovers known step times, hop rates, mean output and N from seeded
synthetic counters (built here from the known parameters, the way a subserver counts); the hysteresis keeps B
from flapping between near-equal candidates and changes it once on a real shift."""

from __future__ import annotations

import random

import pytest

from tokenrouter.core.autotune import AutotuneController, Solution
from tokenrouter.core.autotune_counters import (
    NUM_BATCH_BUCKETS,
    BatchTimes,
    CounterSnapshot,
    ModelCounters,
    batch_bucket,
)
from tokenrouter.core.autotune_estimate import Estimates, Estimator, fit_step_line
from tokenrouter.core.config import AutotuneConfig, ConfigError
from tokenrouter.core.policy import Policy, PolicyKind


class SyntheticServer:
    """Cumulative counters of a two-model deployment, advanced window by window from known parameters, as the
    runtime counts them: steps per batch size with their time, tokens committed, hand-offs sent.

    Model 0 hops with probability `p0` per routed token and drops the token (R2R's small model); model 1 hands
    back with probability `p1` per token and keeps it (R-Stitch's large model). Step time of model i with b rows
    is `a[i] + c[i] * b`, times (1 + noise) with relative noise `noise`."""

    def __init__(self, seed: int, a=(3.0, 20.0), c=(0.5, 0.2), p0=0.2, p1=0.5, mean_output=300.0, noise=0.05):
        self.rng = random.Random(seed)
        self.a, self.c, self.p0, self.p1, self.mean_output, self.noise = a, c, p0, p1, mean_output, noise
        self.batches = [BatchTimes(), BatchTimes()]
        self.tokens = [0, 0]
        self.hops = [0, 0]
        self.finished = self.finished_tokens = 0
        self.live = 8

    def window(self, steps_per_model: int = 40, sizes=((1, 8), (1, 4))) -> None:
        for i in (0, 1):
            for _ in range(steps_per_model):
                b = self.rng.randint(*sizes[i])
                ms = (self.a[i] + self.c[i] * b) * (1.0 + self.rng.gauss(0.0, self.noise))
                self.batches[i].add(b, ms)
                for _ in range(b):  # every row routes its sampled token
                    if i == 0:
                        if self.rng.random() < self.p0:
                            self.hops[0] += 1  # token dropped
                        else:
                            self.tokens[0] += 1
                    else:
                        self.tokens[1] += 1
                        if self.rng.random() < self.p1:
                            self.hops[1] += 1  # token kept
        for _ in range(10):
            self.finished += 1
            self.finished_tokens += max(1, round(self.rng.expovariate(1.0 / self.mean_output)))

    def snapshot(self, live: int | None = None) -> CounterSnapshot:
        models = tuple(ModelCounters.of(self.tokens[i], self.hops[i], self.batches[i]) for i in (0, 1))
        return CounterSnapshot(models, self.live if live is None else live, self.finished, self.finished_tokens)


DROPS = (True, False)


def test_buckets_are_exact_up_to_16_then_coarser():
    assert [batch_bucket(b) for b in (1, 2, 16)] == [0, 1, 15]
    assert batch_bucket(17) == batch_bucket(24) == 16 and batch_bucket(25) == 17
    assert batch_bucket(10_000) == NUM_BATCH_BUCKETS - 1
    bt = BatchTimes()
    for b, ms in ((3, 1.0), (3, 2.0), (20, 5.0)):
        bt.add(b, ms)
    assert bt.steps[2] == 2 and bt.rows[2] == 6 and bt.ms[2] == 3.0 and bt.rows[16] == 20


def test_line_fit_is_exact_on_a_line_and_flat_on_one_size():
    pts = [(b, 4.0 + 0.25 * b, w) for b, w in ((1, 5), (4, 1), (9, 30))]
    line = fit_step_line(pts)
    assert line.intercept_ms == pytest.approx(4.0) and line.per_row_ms == pytest.approx(0.25)
    one = fit_step_line([(6.0, 27.9, 10.0)])
    assert one.per_row_ms == 0.0 and one.at(1) == one.at(40) == pytest.approx(27.9)
    # A step never gets faster with more rows: a falling fit is clamped flat at the weighted mean.
    falling = fit_step_line([(1.0, 10.0, 1.0), (8.0, 8.0, 1.0)])
    assert falling.per_row_ms == 0.0 and falling.at(4) == pytest.approx(9.0)
    assert fit_step_line([]) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimator_recovers_known_step_times_hop_rates_output_and_n(seed):
    srv = SyntheticServer(seed)
    est = Estimator(DROPS, half_life_s=30.0, step_half_life_s=60.0)
    for t in range(61):
        est.update(srv.snapshot(live=7 if t % 5 == 0 else 8), float(t))  # a dip at every fifth sample
        srv.window()
    e = est.estimates()
    assert e.concurrency == 8
    # About 60 windows x 40 steps x 4.5 rows of decisions on model 0 (decayed): binomial sd < 0.01.
    assert e.hop_prob[0] == pytest.approx(0.2, abs=0.02)
    assert e.hop_prob[1] == pytest.approx(0.5, abs=0.03)
    for i, (a, c) in enumerate(((3.0, 0.5), (20.0, 0.2))):
        line = e.step[i]
        assert line.intercept_ms == pytest.approx(a, rel=0.05), i
        assert line.per_row_ms == pytest.approx(c, abs=0.05), i
    assert e.mean_output == pytest.approx(300.0, rel=0.15)  # ~430 decayed exponential samples: sd ~5%


def test_decisions_count_dropped_tokens_only_where_the_router_drops_them():
    srv = SyntheticServer(3, p0=0.4, p1=0.3, noise=0.0)
    wrong = Estimator((False, True), 1e9, 1e9)  # hop semantics swapped: both estimates are biased
    right = Estimator(DROPS, 1e9, 1e9)
    for t in range(30):
        for est in (wrong, right):
            est.update(srv.snapshot(), float(t))
        srv.window()
    r, w = right.estimates(), wrong.estimates()
    assert r.hop_prob[0] == pytest.approx(0.4, abs=0.02) and r.hop_prob[1] == pytest.approx(0.3, abs=0.02)
    # Swapped, model 0 divides hops by tokens only, p / (1 - p) (0.67 for 0.4), and model 1 by tokens + hops,
    # q / (1 + q) (0.23 for 0.3): the same counters, so exactly these functions of the right estimates.
    r0, r1 = r.hop_prob
    assert w.hop_prob[0] == pytest.approx(r0 / (1 - r0), rel=1e-9)
    assert w.hop_prob[1] == pytest.approx(r1 / (1 + r1), rel=1e-9)


def test_estimates_forget_with_the_half_life():
    srv = SyntheticServer(4, p0=0.05, noise=0.0)
    srv.rng = random.Random(4)
    est = Estimator(DROPS, half_life_s=10.0, step_half_life_s=60.0)
    for t in range(200):  # long enough that the old regime has reached its steady weight
        est.update(srv.snapshot(), float(t))
        srv.window(steps_per_model=200)
    assert est.estimates().hop_prob[0] == pytest.approx(0.05, abs=0.005)
    srv.p0 = 0.3
    for t in range(200, 210):  # one half-life: the old and the new regime weigh the same
        est.update(srv.snapshot(), float(t))
        srv.window(steps_per_model=200)
    est.update(srv.snapshot(), 210.0)
    assert est.estimates().hop_prob[0] == pytest.approx(0.175, abs=0.01)
    for t in range(211, 300):
        est.update(srv.snapshot(), float(t))
        srv.window(steps_per_model=200)
    assert est.estimates().hop_prob[0] == pytest.approx(0.3, abs=0.01)


def test_counters_that_go_backwards_are_a_new_baseline():
    srv = SyntheticServer(5)
    est = Estimator(DROPS, 1e9, 1e9)  # no decay: sums are plain totals
    for t in range(10):
        est.update(srv.snapshot(), float(t))
        srv.window()
    before, steps = est.estimates(), est.steps(0)
    assert steps == pytest.approx(9 * 40)
    restarted = SyntheticServer(6)  # model counters start again at 0 (a restarted subserver)
    restarted.finished, restarted.finished_tokens = srv.finished, srv.finished_tokens
    est.update(restarted.snapshot(), 10.0)
    assert est.estimates().step == before.step and est.steps(0) == pytest.approx(steps)  # nothing subtracted
    restarted.window()
    est.update(restarted.snapshot(), 11.0)
    assert est.steps(0) == pytest.approx(steps + 40)


def test_live_n_follows_a_ramp_within_half_a_half_life():
    srv = SyntheticServer(7)
    est = Estimator(DROPS, half_life_s=10.0, step_half_life_s=60.0)
    for t in range(30):
        est.update(srv.snapshot(live=4), float(t))
    for t in range(30, 36):
        est.update(srv.snapshot(live=16), float(t))
    assert est.estimates().concurrency == 16  # 6 of the last 11 samples
    est2 = Estimator(DROPS, half_life_s=10.0, step_half_life_s=60.0)
    for t in range(30):
        est2.update(srv.snapshot(live=4), float(t))
    for t in range(30, 34):
        est2.update(srv.snapshot(live=16), float(t))
    assert est2.estimates().concurrency < 16  # 4 of 11: not yet


def test_step_times_measured_at_another_n_fade_when_n_moves():
    # At N = 16 the small model's steps of 1-4 rows took 3 + 0.5 b ms (a busy peer); at N = 4 they take 1 + 0.5 b.
    # Ten seconds after N fell the line must price N = 4's steps, though the steps' half-life is a minute.
    srv = SyntheticServer(3, a=(3.0, 20.0), noise=0.0)
    est = Estimator(DROPS, half_life_s=4.0, step_half_life_s=60.0)
    for t in range(120):
        srv.window(sizes=((1, 4), (1, 4)))
        est.update(srv.snapshot(live=16), float(t))
    srv.a = (1.0, 20.0)
    for t in range(120, 130):
        srv.window(sizes=((1, 4), (1, 4)))
        est.update(srv.snapshot(live=4), float(t))
    line = est.estimates().step[0]
    assert line is not None and line.at(2) == pytest.approx(2.0, rel=0.15)  # N = 16 (4.0) weighed 80% before
    # A closed loop's dip by one at each finish is no new N: nothing fades.
    steady = Estimator(DROPS, half_life_s=4.0, step_half_life_s=60.0)
    srv2 = SyntheticServer(4, noise=0.0)
    for t in range(60):
        srv2.window(sizes=((1, 4), (1, 4)))
        steady.update(srv2.snapshot(live=7 if t % 3 == 0 else 8), float(t))
    assert steady.steps(0) > 30 * 40


# ---- the controller -----------------------------------------------------------------------------------------
CFG = AutotuneConfig(observe_s=1.0, interval_s=5.0, tolerance=0.1, min_gain=0.03, hold_s=10.0, half_life_s=5.0,
                     step_half_life_s=60.0, min_steps=20, verify_s=0.0)  # fmt: skip
"""The model's decisions alone (the tests of verification, at the end, turn it on: CFG_VERIFY)."""
CFG_VERIFY = AutotuneConfig(**{**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__}, "verify_s": 10.0})


class TableSolve:
    """A fake solve: throughput of each B from a function of the estimates; B* is the best of `candidates`."""

    def __init__(self, throughput, candidates=((1, 1), (1, 2), (1, 3), (1, 4), (2, 1))):
        self.throughput, self.candidates, self.calls = throughput, candidates, []

    def __call__(self, est: Estimates, current: tuple[int, ...]) -> Solution:
        self.calls.append((est, current))
        scores = {b: self.throughput(b, est) for b in self.candidates}
        best = max(scores, key=scores.get)
        return Solution(best, scores[best], self.throughput(current, est))


def drive(ctrl: AutotuneController, srv: SyntheticServer, t0: int, t1: int, apply=True):
    decisions = []
    for t in range(t0, t1):
        srv.window()
        d = ctrl.observe(srv.snapshot(), float(t))
        if d is not None:
            decisions.append(d)
            if apply:
                ctrl.applied(d, Policy(PolicyKind.DELAYED, d.new))
    return decisions


def test_no_flapping_between_two_near_equal_b():
    # Whichever B is in force, the other is predicted 2% better: below min_gain, so B never moves.
    def tp(b, est):
        return 1000.0 if b not in ((1, 3), (1, 4)) else (1000.0 if b == ctrl.policy.thresholds else 1020.0)

    solve = TableSolve(tp, candidates=((1, 3), (1, 4)))
    ctrl = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 3)), solve, DROPS)
    assert drive(ctrl, SyntheticServer(8), 0, 200) == []
    # The premise: it solved again and again (the synthetic counters' noise drifts the estimates past half the
    # tolerance now and then; interval re-solves need such a drift), yet B never moved.
    assert len(solve.calls) >= 10 and ctrl.changes == 0
    assert "hold" in ctrl.status


def test_a_big_shift_changes_b_once():
    # B* depends on the hop rate as estimated: (1,1) below 0.15, (1,3) above, each 20% better than the other there.
    def tp(b, est):
        good = (1, 3) if est.hop_prob[0] > 0.15 else (1, 1)
        return 1200.0 if b == good else 1000.0

    srv = SyntheticServer(9, p0=0.05)
    ctrl = AutotuneController(CFG, Policy(PolicyKind.EAGER), TableSolve(tp), DROPS)
    assert drive(ctrl, srv, 0, 60) == []  # eager = (1,1) is the best: solved, nothing to change
    assert ctrl.solves >= 5
    srv.p0 = 0.35
    changes = drive(ctrl, srv, 60, 200)
    assert len(changes) == 1
    d = changes[0]
    assert d.old == (1, 1) and d.new == (1, 3) and d.predicted_gain == pytest.approx(0.2)
    assert d.at > 60 and d.estimates.hop_prob[0] > 0.15
    assert ctrl.policy.thresholds == (1, 3) and ctrl.history == [d]


def test_hold_time_between_changes():
    state = {"good": (1, 2)}

    def tp(b, est):
        return 1500.0 if b == state["good"] else 1000.0

    srv = SyntheticServer(10)
    ctrl = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(tp), DROPS)
    changes = []
    for t in range(80):
        srv.window()
        d = ctrl.observe(srv.snapshot(), float(t))
        if d is not None:
            ctrl.applied(d, Policy(PolicyKind.DELAYED, d.new))
            changes.append(d)
            state["good"] = (1, 4)  # at once the next solve (interval_s later) wants another change: it must wait
    assert [d.new for d in changes] == [(1, 2), (1, 4)]
    assert changes[1].at - changes[0].at >= CFG.hold_s > CFG.interval_s
    assert ctrl.solves >= 3  # the solve in between was held, not skipped


def test_no_solve_before_every_model_ran_min_steps():
    solve = TableSolve(lambda b, est: 1000.0)
    cfg = AutotuneConfig(min_steps=200, half_life_s=5.0, step_half_life_s=60.0)
    ctrl = AutotuneController(cfg, Policy(PolicyKind.EAGER), solve, DROPS)
    srv = SyntheticServer(11)
    drive(ctrl, srv, 0, 4)  # 40 steps per model per window: 160 < 200
    assert solve.calls == [] and "waiting" in ctrl.status
    drive(ctrl, srv, 4, 8)
    assert len(solve.calls) == 1


def test_a_decision_not_applied_leaves_b_and_a_failed_solve_keeps_it():
    def tp(b, est):
        return 2000.0 if b == (1, 3) else 1000.0

    ctrl = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(tp), DROPS)
    srv = SyntheticServer(12)
    ds = drive(ctrl, srv, 0, 30, apply=False)
    assert ds and all(d.old == (1, 1) for d in ds) and ctrl.policy.thresholds == (1, 1) and ctrl.changes == 0

    def boom(est, cur):
        raise ValueError("state space too large")

    ctrl2 = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 1)), boom, DROPS)
    assert drive(ctrl2, SyntheticServer(13), 0, 30) == []
    assert ctrl2.status.startswith("solve failed") and ctrl2.policy.thresholds == (1, 1)


def test_an_operator_change_is_followed_and_held():
    def tp(b, est):
        return 1500.0 if b == (1, 3) else 1000.0

    ctrl = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(tp), DROPS)
    srv = SyntheticServer(14)
    assert [d.new for d in drive(ctrl, srv, 0, 30)] == [(1, 3)]
    ctrl.reset(Policy(PolicyKind.DELAYED, (2, 2)), 30.0)
    later = drive(ctrl, srv, 31, 60)
    assert [d.old for d in later] == [(2, 2)] and later[0].at >= 30.0 + CFG.hold_s


def test_sync_policies_are_refused():
    with pytest.raises(ValueError, match="step-sync"):
        AutotuneController(CFG, Policy(PolicyKind.STEP_SYNC), TableSolve(lambda b, e: 1.0), DROPS)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"interval_s": 0}, "interval_s"), ({"min_gain": -0.1}, "min_gain"), ({"min_steps": 0}, "min_steps"),
     ({"max_states": 10}, "max_states"), ({"half_life_s": float("nan")}, "half_life_s")],
)  # fmt: skip
def test_config_values_are_checked(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        AutotuneConfig(**kw)


def test_no_solve_while_idle():
    solve = TableSolve(lambda b, est: 1000.0)
    ctrl = AutotuneController(CFG, Policy(PolicyKind.EAGER), solve, DROPS)
    srv = SyntheticServer(15)
    for t in range(30):
        srv.window()
        ctrl.observe(srv.snapshot(live=0), float(t))  # counters move (a drain) but nothing is live any more
    assert solve.calls == [] and ctrl.status.startswith("idle")


# --- verification: a change is measured against the B before it, and undone when it measured slower ---


def drive_rates(ctrl: AutotuneController, srv: SyntheticServer, t0: int, t1: int, steps_under, shift=None,
                stop_at_first=False):  # fmt: skip
    """Like `drive`, with the tokens a window commits set by the B in force (`steps_under(B)` steps per model per
    window: the server's true throughput under that B, which the model does not know); `shift(t)` may move the
    workload. Every decision is applied. Returns the decisions (and stops after the first, if asked)."""
    decisions = []
    base_p0 = srv.p0
    for t in range(t0, t1):
        if stop_at_first and decisions:
            break
        if shift is not None:
            shift(t)
        else:  # the hop rate wobbles by 7% every 10 s: within the tolerance, past half of it, so the interval's
            srv.p0 = base_p0 * (1.07 if (t // 10) % 2 else 1.0)  # re-solves come (a fake solve may change its mind)
        srv.window(steps_per_model=10 * steps_under(ctrl.policy.thresholds))  # many tokens: rates barely noisy
        d = ctrl.observe(srv.snapshot(), float(t))
        if d is not None:
            decisions.append(d)
            ctrl.applied(d, Policy(PolicyKind.DELAYED, d.new))
    return decisions


class Prefers:
    """The model's ranking (right or wrong): `best` predicted 50% above every other B, whatever the estimates."""

    def __init__(self, best=(1, 1)):
        self.best = best

    def __call__(self, b, est):
        return 1500.0 if b == self.best else 1000.0


def warmed(srv: SyntheticServer, steps_under, t1: int = 20) -> AutotuneController:
    """A controller that served (1,1) for `t1` s (the model agreeing), then is told (1,3) is better: the change
    comes with a measured baseline of (1,1), so it is a trial. (A change at start-up has none: unverified.)"""
    prefers = Prefers((1, 1))
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(prefers), DROPS)
    assert drive_rates(ctrl, srv, 0, t1, steps_under) == []
    prefers.best = (1, 3)
    return ctrl


def in_trial(seed: int) -> tuple[SyntheticServer, AutotuneController, int]:
    """`warmed`, driven on until its change to (1,3) (the same rate under every B so far): the server, the
    controller with the trial under way, and the next second to drive from."""
    srv = SyntheticServer(seed, noise=0.0)
    ctrl = warmed(srv, lambda b: 40)
    first = drive_rates(ctrl, srv, 20, 60, lambda b: 40, stop_at_first=True)
    assert [d.new for d in first] == [(1, 3)] and ctrl.trial is not None
    return srv, ctrl, int(first[0].at) + 1


def test_a_change_that_measures_slower_is_reverted_and_not_tried_again():
    srv = SyntheticServer(16, noise=0.0)
    ctrl = warmed(srv, lambda b: 40)
    ds = drive_rates(ctrl, srv, 20, 140, lambda b: 30 if b == (1, 3) else 40)  # (1,3) is 25% slower in truth
    assert [(d.old, d.new, d.revert) for d in ds] == [((1, 1), (1, 3), False), ((1, 3), (1, 1), True)]
    change, revert = ds
    # The trial: two observations of settling, then verify_s measured; the revert follows at its end.
    assert revert.at == change.at + 2 * CFG_VERIFY.observe_s + CFG_VERIFY.verify_s
    assert revert.predicted_gain == pytest.approx(40 / 30 - 1, rel=0.1)  # measured: the old B's rate over the new
    assert "revert" in revert.describe() and revert.as_dict()["revert"] is True
    assert ctrl.policy.thresholds == (1, 1) and ctrl.reverts == 1 and ctrl.changes == 2
    assert "measured slower" in ctrl.status  # the model still ranks (1,3) first; it is held, for 100 s


def test_a_change_that_measures_faster_or_equal_stays():
    srv = SyntheticServer(17)
    ctrl = warmed(srv, lambda b: 40)
    ds = drive_rates(ctrl, srv, 20, 100, lambda b: 44 if b == (1, 3) else 40)
    assert [(d.new, d.revert) for d in ds] == [((1, 3), False)]
    assert ctrl.reverts == 0 and ctrl.trial is None and ctrl.policy.thresholds == (1, 3)


def test_no_revert_when_the_workload_moved_during_the_trial_or_verification_is_off():
    srv, ctrl, t = in_trial(18)

    def shift(t):  # the hop rate moves right after the change: the two windows are not comparable
        srv.p0 = 0.45

    later = drive_rates(ctrl, srv, t, t + 60, lambda b: 30 if b == (1, 3) else 40, shift)
    assert later == [] and ctrl.policy.thresholds == (1, 3) and ctrl.reverts == 0

    # The clients leave during the trial (N 8 -> 3, each window's median N tells, the decayed estimate not yet):
    # the rate falls with them, and that is no verdict on the B.
    srv2, ctrl2, t = in_trial(22)

    def leave(t_now):
        srv2.live = 8 if t_now < t + 4 else 3

    assert drive_rates(ctrl2, srv2, t, t + 14, lambda b: 40 if srv2.live == 8 else 15, leave) == []
    assert ctrl2.reverts == 0 and ctrl2.trial is None and ctrl2.policy.thresholds == (1, 3)

    off = AutotuneController(CFG, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(Prefers((1, 3))), DROPS)
    assert CFG.verify_s == 0
    ds = drive_rates(off, SyntheticServer(19, noise=0.0), 0, 100, lambda b: 30 if b == (1, 3) else 40)
    assert [d.new for d in ds] == [(1, 3)] and off.reverts == 0


def test_a_rejected_b_is_tried_again_once_the_workload_moved():
    srv = SyntheticServer(20, noise=0.0)
    ctrl = warmed(srv, lambda b: 40)
    ds = drive_rates(ctrl, srv, 20, 80, lambda b: 30 if b == (1, 3) else 40)
    assert [d.revert for d in ds] == [False, True] and (1, 3) in ctrl.rejected
    srv.p0 = 0.45  # a new regime: (1,3) may be right now, and this time it is
    ds = drive_rates(ctrl, srv, 80, 180, lambda b: 40)
    assert [d.new for d in ds] == [(1, 3)] and ctrl.policy.thresholds == (1, 3) and (1, 3) not in ctrl.rejected


def test_an_operator_change_ends_a_trial():
    srv, ctrl, t = in_trial(21)
    ctrl.reset(Policy(PolicyKind.DELAYED, (2, 2)), float(t))
    assert ctrl.trial is None
    # (2,2) measured slower than (1,3) was: not autotune's change to undo; it moves on by the model instead.
    ds = drive_rates(ctrl, srv, t + 1, t + 40, lambda b: 30 if b == (2, 2) else 40)
    assert ds and not any(d.revert for d in ds) and ds[0].old == (2, 2)


def test_a_change_without_a_measured_baseline_is_not_verified():
    # At start-up the B in force has no verify_s of its own measured yet: the first change cannot be compared.
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(Prefers((1, 3))), DROPS)
    ds = drive_rates(ctrl, SyntheticServer(23, noise=0.0), 0, 60, lambda b: 30 if b == (1, 3) else 40)
    assert [(d.new, d.revert) for d in ds] == [((1, 3), False)] and ds[0].at < CFG_VERIFY.verify_s
    assert ctrl.reverts == 0


def test_a_baseline_window_that_straddles_a_change_of_n_is_no_baseline():
    # 16 clients until t = 15, then 4 (the rate falls with them); the model turns to (1,3) at t = 20, when the
    # `verify_s` before the change holds both regimes: comparing (1,3) at N = 4 with it would undo a B for a fall
    # that N made.
    srv = SyntheticServer(24, noise=0.0)
    srv.live = 16
    prefers = Prefers((1, 1))
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(prefers), DROPS)

    def ramp_down(t):
        srv.live = 16 if t < 15 else 4
        if t == 20:
            prefers.best = (1, 3)

    ds = drive_rates(ctrl, srv, 0, 60, lambda b: 40 if srv.live == 16 else 10, ramp_down)
    assert [(d.new, d.revert) for d in ds] == [((1, 3), False)] and ds[0].at >= 20
    assert ctrl.reverts == 0


def test_a_baseline_whose_first_sample_is_at_another_n_is_no_baseline():
    # Live N ramp (H200, 2026-12-02): a solve kept the controller from observing while N fell from 16 to 4, so the
    # `verify_s` before the next change held one sample at N = 16 (its start) and then samples at N = 4 only; its
    # rate, mostly N = 16's, undid a right B at N = 4 (measured +64%). The window's start sample counts too.
    srv = SyntheticServer(24, noise=0.0)
    prefers = Prefers((1, 1))
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(prefers), DROPS)
    ds = []
    for t in range(60):
        srv.live = 16 if t < 13 else 4
        prefers.best = (1, 3) if t >= 20 else (1, 1)
        srv.window(steps_per_model=10 * (40 if srv.live == 16 else 10))
        if 11 <= t < 17:
            continue  # a solve under way: nothing observed
        d = ctrl.observe(srv.snapshot(), float(t))
        if d is not None:
            ds.append(d)
            ctrl.applied(d, Policy(PolicyKind.DELAYED, d.new))
    assert [(d.new, d.revert) for d in ds] == [((1, 3), False)] and ctrl.reverts == 0


# --- the contract, pinned: the margin both ways, a line that cannot go negative --------------------------------


def exact_rates(ctrl: AutotuneController, srv: SyntheticServer, t0: int, t1: int, steps_under) -> list:
    """`drive_rates` with windows whose committed tokens are exactly steps x rows: fixed batch sizes (4 on the small
    model, 2 on the large one) and no hops (`srv.p0 = 0`), so a B's measured rate is what `steps_under(B)` says."""
    decisions = []
    for t in range(t0, t1):
        srv.window(steps_per_model=steps_under(ctrl.policy.thresholds), sizes=((4, 4), (2, 2)))
        d = ctrl.observe(srv.snapshot(), float(t))
        if d is not None:
            decisions.append(d)
            ctrl.applied(d, Policy(PolicyKind.DELAYED, d.new))
    return decisions


@pytest.mark.parametrize(("new_steps", "reverted"), [(97, True), (99, False), (100, False), (103, False)])
def test_the_revert_margin_both_ways(new_steps, reverted):
    """verify_margin 2% (CFG_VERIFY): a B measured 3% slower than the B before it is undone; 1% slower, equal or
    faster is kept. (A margin of the wrong sign would undo the 1% and the equal one; a 20% margin would keep the
    3% one.)"""
    assert CFG_VERIFY.verify_margin == 0.02
    srv = SyntheticServer(31, noise=0.0, p0=0.0)
    prefers = Prefers((1, 1))
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(prefers), DROPS)
    steps = lambda b: new_steps if b == (1, 3) else 100  # noqa: E731
    assert exact_rates(ctrl, srv, 0, 20, steps) == []
    prefers.best = (1, 3)
    ds = exact_rates(ctrl, srv, 20, 60, steps)
    assert [(d.new, d.revert) for d in ds] == [((1, 3), False)] + ([((1, 1), True)] if reverted else [])
    if reverted:  # the measured ratio, old over new: 100 / 97
        assert ds[1].predicted_gain == pytest.approx(100 / 97 - 1, rel=1e-6)


def test_a_line_fitted_to_a_convex_curve_never_goes_below_zero():
    # Chord of a convex step curve through batch sizes 8 and 16: ms = 1 + b^2 / 8 at b = 8, 16 (9 and 33 ms) has
    # slope 3 and intercept -15 unconstrained; constrained to a >= 0 it goes through the origin: slope = sum(r m) /
    # sum(r^2) = (8*9 + 16*33) / (64 + 256) = 600 / 320 = 1.875.
    line = fit_step_line([(8.0, 9.0, 1.0), (16.0, 33.0, 1.0)])
    assert line is not None
    assert line.intercept_ms == 0.0 and line.per_row_ms == pytest.approx(1.875)
    assert all(line.at(b) > 0 for b in range(1, 65))
    assert line.at(1) == pytest.approx(4.5)  # the floor: half the fastest bucket's 9 ms (1.875 alone is below it)
    # A line with a positive intercept is the plain least-squares one: 2 + 0.5 b through b = 1..4.
    plain = fit_step_line([(b, 2.0 + 0.5 * b, 1.0) for b in (1.0, 2.0, 3.0, 4.0)])
    assert plain is not None and (plain.intercept_ms, plain.per_row_ms) == pytest.approx((2.0, 0.5))


def test_a_load_that_never_holds_steady_changes_no_b_and_says_so_once():
    """Open-loop arrivals: the live count wanders, so no change could be measured against the B before it; the
    controller holds B and leaves one notice for the driver's log."""
    srv = SyntheticServer(32, noise=0.0)
    prefers = Prefers((1, 1))
    ctrl = AutotuneController(CFG_VERIFY, Policy(PolicyKind.DELAYED, (1, 1)), TableSolve(prefers), DROPS)
    rng = random.Random(5)

    def wander(t):
        srv.live = rng.choice((3, 8, 14))  # a queue that fills and drains
        if t == 25:
            prefers.best = (1, 3)

    ds = drive_rates(ctrl, srv, 0, 80, lambda b: 40, wander)
    assert ds == [] and ctrl.policy.thresholds == (1, 1)
    assert len(ctrl.notices) == 1 and "open-loop" in ctrl.notices[0]


def test_a_change_that_waited_is_made_when_the_wait_ends_from_the_same_solve():
    """An operator set B at t = 0 (held for `hold_s`); the first solve, at once, prefers another B and must wait. No
    estimate moves and the interval is long, so no second solve comes: the change is made when the hold ends, from
    the solve that waited (the live N-ramp case: a change waiting for a steady load, with nothing left to move)."""
    cfg = AutotuneConfig(**{**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__},
                            "tolerance": 0.5, "interval_s": 1000.0, "hold_s": 10.0})  # fmt: skip
    srv = SyntheticServer(33, noise=0.0)
    solve = TableSolve(Prefers((1, 3)))
    ctrl = AutotuneController(cfg, Policy(PolicyKind.DELAYED, (1, 1)), solve, DROPS)
    ctrl.reset(Policy(PolicyKind.DELAYED, (1, 2)), 0.0)
    ds = drive(ctrl, srv, 1, 30)
    assert len(solve.calls) == 1 and solve.calls[0][1] == (1, 2)
    assert [(d.old, d.new) for d in ds] == [((1, 2), (1, 3))] and ds[0].at == cfg.hold_s
