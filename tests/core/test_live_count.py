"""The live request count N: every admission and finish is announced, and no lag of a peer's N deadlocks."""

from __future__ import annotations

import random

import pytest
from cluster import LiveCluster
from direct_cluster import Cluster

from tokenrouter.core.live_count import LiveView
from tokenrouter.core.messages import LiveCount, Send
from tokenrouter.core.policy import Policy, clamp_thresholds, table_thresholds
from tokenrouter.routers import ProbRouter

# The shape `trsim tune` writes: a B(N) table.
TABLE = {1: (1, 1), 3: (1, 3), 8: (8, 1)}


def test_admission_is_announced_so_the_tune_table_cannot_deadlock():
    """The issue's scenario: 3 live, two hop to the large model, 5 more arrive. At N=8 the entry wants 8
    ready (has 6); the large model must learn N=8 (B_1 = 1) rather than keep N=3 (B_1 = 3, has 2)."""
    c = Cluster(policy=Policy("delayed", table=TABLE), router_script={(0, "a"): [1], (0, "b"): [1]})
    for r in "abc":
        c.submit(r, [1, 2], max_tokens=6)
    small, large = c.scheds
    assert large.active == 3 and large.thresholds() == (1, 3)
    c.step(0)  # a and b hop; c stays
    assert len(large.waiting) == 2 and large.schedule(c.now) is None  # 2 < B_1 = 3
    for r in "defgh":
        c.submit(r, [1, 2], max_tokens=6)
    assert small.thresholds() == (8, 1) and len(small.waiting) == 6 and small.schedule(c.now) is None
    assert (large.active, large.epoch) == (small.active, small.epoch) == (8, 8)
    assert c.step(1) is not None  # B_1 = 1 now
    c.run()
    assert len(c.finished) == 8


def test_without_announcements_the_same_scenario_stalls():
    """The test above can fail: drop the admission announcements and the run stops with work left."""
    c = Cluster(policy=Policy("delayed", table=TABLE), router_script={(0, "a"): [1], (0, "b"): [1]})
    deliver = c.deliver
    c.deliver = lambda acts: deliver([a for a in acts if not (isinstance(a, Send) and isinstance(a.msg, LiveCount))])
    for r in "abc":
        c.submit(r, [1, 2], max_tokens=6)
    c.step(0)
    for r in "defgh":
        c.submit(r, [1, 2], max_tokens=6)
    c.run()
    assert len(c.finished) < 8 and c.scheds[1].thresholds() == (1, 3)


def test_a_peer_keeps_the_newest_announcement_whatever_the_arrival_order():
    entry, peer = LiveView(0, 2, owner=True), LiveView(1, 2, owner=False)
    sent = []
    for delta in (1, 1, 1, -1, 1, -1, -1):
        entry.change(delta)
        sent.extend(entry.announce())
    for msg in random.Random(3).sample(sent, len(sent)):
        peer.observe(msg.active, msg.epoch)
    assert (peer.active, peer.epoch) == (entry.active, entry.epoch) == (1, 7)
    with pytest.raises(ValueError):
        peer.change(1)


@pytest.mark.parametrize("n", range(1, 12))
def test_every_n_a_peer_may_believe_gets_guarded_thresholds(n):
    """Whatever N a subserver believes, its thresholds satisfy the guard for that N (the argument in
    `live_count` needs exactly this at the quiescent state, where every belief equals the true N)."""
    b = Policy("delayed", table=TABLE).thresholds_for(n, 2)
    assert sum(x - 1 for x in b) < n
    assert b == clamp_thresholds(table_thresholds(TABLE, n), n)  # the table's rule, then the clamp


@pytest.mark.parametrize("seed", range(12))
def test_random_message_delays_never_deadlock_a_table_policy(seed):
    """Bursts of arrivals with slow, reordered links: peers' N lags by several announcements at times."""
    rng = random.Random(seed)
    p = rng.choice([0.2, 0.4, 0.6])
    c = LiveCluster(
        lambda: ProbRouter([[1 - p, p], [1.0, 0.0]], [[True, False], [True, True]], seed),
        num_models=2,
        seed=seed,
        policy=Policy("delayed", table=TABLE),
        overlap=seed % 2 == 1,
        max_delay=rng.choice([0.5, 4.0, 12.0]),
    )
    for i in range(14):
        c.submit(f"r{i}", [rng.randrange(1, 99) for _ in range(rng.randint(1, 5))], rng.randint(2, 12),
                 at=rng.choice([0.0, 5.0, 30.0]) + rng.random())  # fmt: skip
    c.run()  # check_end: every request finished, live counts converged to 0


@pytest.mark.parametrize("seed", range(4))
def test_random_delays_deadlock_without_announcements(seed):
    """The random-delay test above can fail: without admission announcements some seeds stall."""
    stalled = 0
    for s in range(seed * 5, seed * 5 + 5):
        rng = random.Random(s)
        c = LiveCluster(
            lambda s=s: ProbRouter([[0.6, 0.4], [1.0, 0.0]], [[True, False], [True, True]], s),
            num_models=2,
            seed=s,
            policy=Policy("delayed", table=TABLE),
            drop_live_counts=True,
        )
        for i in range(14):
            c.submit(f"r{i}", [1, 2, 3], rng.randint(4, 12), at=rng.choice([0.0, 5.0]) + rng.random())
        try:
            c.run()
        except AssertionError:
            stalled += 1
    assert stalled > 0
