"""Completion extension of the Markov model: requests finish after a geometric number of committed tokens and
their clients' next requests start at the entry. Checked against the naive post-launch chain, an event
simulation and hand-derived ME cases (the lockstep orbit the plain chain is stuck in)."""

from __future__ import annotations

import numpy as np
import pytest
from chain_reference import event_simulation, post_launch_reference

from tokenrouter.markov import MarkovModel, feasible_thresholds, me_preset, r2r_preset, rstitch_preset, throughput
from tokenrouter.markov.steps import live_thresholds

ME_MS = [0.9, 4.6, 17.0]  # the ME case: the last model is slower than the other two together


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


RANDOM3 = (
    np.array([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]]),
    np.array([[1, 0, 1], [1, 0, 0], [1, 1, 0]], dtype=float),
)


@pytest.mark.parametrize(
    ("d", "pc", "n", "thresholds", "mean_output"),
    [
        ([2, 9], r2r_preset(0.35), 3, [(1, 1), (1, 2), (2, 1)], 4.0),
        ([2, 9], rstitch_preset(0.35, 0.6), 3, [(1, 1), (1, 3)], 2.5),
        ([1, 2, 4], me_preset(3), 3, [(1, 1, 1), (1, 2, 1), (1, 1, 3)], 5.0),
        ([1, 2, 4], me_preset(3), 2, [(1, 1, 1), (2, 1, 1)], 1.5),
        ([2, 3, 7], RANDOM3, 3, [(1, 1, 1), (2, 1, 1), (1, 2, 2)], 3.0),
    ],
)
def test_matches_post_launch_reference(d, pc, n, thresholds, mean_output) -> None:
    model = MarkovModel.create([float(x) for x in d], *pc, concurrency=n, delta_ms=1.0, mean_output=mean_output)
    for b in thresholds:
        ref = post_launch_reference(d, *pc, b, n, completion=1.0 / mean_output) * 1000  # per ms -> per s
        assert rel(model.throughput(b).throughput_tok_s, ref) < 1e-9


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("mean_output", [3.0, 50.0, 1000.0])
def test_me_eager_leaves_lockstep(n: int, mean_output: float) -> None:
    # Without completions all N move together: N tokens per L0 + L1 + L2. With them, the first finish splits
    # the group (the replacement misses its old companions' launch at the entry); since L2 > L0 + L1 a group
    # coming back always finds model 2 busy with the other one, so exactly two groups alternate on model 2
    # (a third merges while waiting there): N tokens per 2 * L2, whatever the mean output length.
    pr, c = me_preset(3)
    lockstep = throughput(ME_MS, pr, c, (1, 1, 1), n).throughput_tok_s
    assert rel(lockstep, 1000 * n / sum(ME_MS)) < 1e-12
    res = throughput(ME_MS, pr, c, (1, 1, 1), n, mean_output=mean_output)
    assert rel(res.throughput_tok_s, 1000 * n / (2 * ME_MS[2])) < 1e-9
    assert res.busy_fraction[2] == pytest.approx(1.0)


def test_one_token_requests_stay_in_lockstep() -> None:
    # Every request ends after one token, so all N finish together and their replacements start together.
    res = throughput(ME_MS, *me_preset(3), (1, 1, 1), 4, mean_output=1.0)
    assert rel(res.throughput_tok_s, 1000 * 4 / sum(ME_MS)) < 1e-12


@pytest.mark.parametrize("n", [1, 3])
def test_finishing_on_the_entry_changes_nothing(n: int) -> None:
    # R2R that never hops commits everything on the entry: a replacement is queued there before the entry
    # launches again, exactly like the request it replaces.
    pr, c = r2r_preset(0.0)
    base = throughput([6.0, 27.9], pr, c, (1, 1), n).throughput_tok_s
    assert throughput([6.0, 27.9], pr, c, (1, 1), n, mean_output=7.0).throughput_tok_s == pytest.approx(base)


def test_single_me_request_is_unaffected() -> None:
    # N = 1: nothing to fall out of step with, and ME's finishing route leads to the entry anyway.
    base = throughput(ME_MS, *me_preset(3), (1, 1, 1), 1).throughput_tok_s
    res = throughput(ME_MS, *me_preset(3), (1, 1, 1), 1, mean_output=2.0)
    assert rel(res.throughput_tok_s, base) < 1e-12


@pytest.mark.parametrize(
    ("pc", "d", "b", "n", "mean_output"),
    [(me_preset(3), [9, 46, 170], (1, 2, 3), 6, 20.0), (RANDOM3, [2, 3, 7], (1, 2, 1), 4, 5.0)],
)
def test_matches_event_simulation(pc, d, b, n, mean_output) -> None:
    exact = throughput([x / 10 for x in d], *pc, b, n, delta_ms=0.1, mean_output=mean_output).throughput_tok_s
    sim = event_simulation(d, *pc, b, n, 60_000, completion=1.0 / mean_output) * 10_000
    assert rel(sim, exact) < 0.02


@pytest.mark.parametrize("bad", [0.0, 0.5, -3.0, float("nan"), float("inf")])
def test_mean_output_must_be_at_least_one_token(bad: float) -> None:
    with pytest.raises(ValueError, match="mean output"):
        MarkovModel.create(ME_MS, *me_preset(3), 4, mean_output=bad)


@pytest.mark.parametrize("mean_output", [2.0, 10.0, 100.0])
def test_me_pair_held_at_the_entry(mean_output: float) -> None:
    # ME, N = 2, B = (2, 1, 1). Cycles of L0 + L1 + L2 either carry the pair (2 tokens) or one request alone
    # (1 token). When exactly one of the pair ends, the live count is 1 until its replacement is admitted, so
    # B_0 drops to 1 and the other one goes on alone while the replacement waits for it at the entry (pair ->
    # alone, probability 2q(1-q)). The lone one returns and the pair forms again, unless it ended too: then
    # the waiting replacement starts alone (alone -> alone, q). Stationary: alone / pair = 2q(1-q) / (1-q).
    q = 1.0 / mean_output
    pair, alone = 1.0, 2 * q
    expected = 1000 * (2 * pair + alone) / ((pair + alone) * sum(ME_MS))
    res = throughput(ME_MS, *me_preset(3), (2, 1, 1), 2, mean_output=mean_output)
    assert rel(res.throughput_tok_s, expected) < 1e-9


def test_live_thresholds_follow_the_core_policy() -> None:
    from tokenrouter.core.policy import clamp_thresholds

    for m, n in [(2, 6), (3, 5)]:
        for b in feasible_thresholds(m, n):
            for live in range(0, n + 1):
                assert live_thresholds(b, live) == clamp_thresholds(b, live)
