"""A subserver's `Stats`: on the heartbeat, and within `STATS_MIN_GAP_S` of any change of its pages, queues,
requests or steps (so /metrics follows a finished run at once instead of up to a heartbeat later), never more
often than that. Driven on a hand clock through `Subserver._stats` with stand-ins for its scheduler."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.stats import Counters
from tokenrouter.runtime.subserver import STATS_MIN_GAP_S, Subserver

GAP = STATS_MIN_GAP_S


class FakeSub:
    """The attributes `_stats` reads; `sent` collects the Stats it sends."""

    def __init__(self, interval: float = 0.5) -> None:
        kv = SimpleNamespace(num_pages=11, num_free=10)
        self.sched = SimpleNamespace(kv=kv, waiting=[], admit_queue={}, reqs={}, step_id=0, active=0)
        self.counters = Counters()
        self.model = 1
        self.spec = SimpleNamespace(stats_interval_s=interval)
        self.next_stats, self.stats_sent, self.stats_sig = 0.0, float("-inf"), ()
        self.sent: list[P.Stats] = []

    def send_control(self, msg: P.Stats) -> None:
        self.sent.append(msg)

    def tick(self, now: float) -> P.Stats | None:
        n = len(self.sent)
        Subserver._stats(self, now)  # type: ignore[arg-type]
        return self.sent[-1] if len(self.sent) > n else None


def test_a_change_is_sent_within_the_gap_and_the_heartbeat_still_comes():
    s = FakeSub()
    assert s.tick(0.0) is not None  # start-up
    assert s.tick(0.01) is None  # nothing changed, heartbeat not due
    s.sched.kv.num_free = 4  # a request took 6 pages
    assert s.tick(0.02) is None  # changed, but the last Stats left 20 ms ago
    assert s.next_stats == pytest.approx(GAP), "the idle poll must wake when the change may be sent"
    sent = s.tick(GAP)
    assert sent is not None and sent.kv_pages_used == 6
    assert s.tick(GAP + 0.1) is None  # quiet again
    s.sched.kv.num_free = 10  # the request finished: pages back
    sent = s.tick(GAP + 0.2)  # more than the gap since the last Stats: at once
    assert sent is not None and sent.kv_pages_used == 0
    assert s.tick(GAP + 0.2 + 0.49) is None
    assert s.tick(GAP + 0.2 + 0.5) is not None  # heartbeat


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.sched.waiting.append(object()),
        lambda s: s.sched.admit_queue.update(r=object()),
        lambda s: s.sched.reqs.update(r=SimpleNamespace(status=SimpleNamespace(name="RUNNING"))),
        lambda s: setattr(s.sched, "step_id", 1),
        lambda s: s.counters.step(3, 0.0, 0.01),
    ],
)
def test_every_gauge_source_counts_as_a_change(change):
    s = FakeSub()
    s.tick(0.0)
    assert s.tick(0.2) is None
    change(s)
    assert s.tick(0.21) is not None


def test_no_more_often_than_the_gap_while_busy():
    s = FakeSub()
    sent_at = []
    for k in range(200):  # a step every 2 ms for 0.4 s, each a change
        now = k * 0.002
        s.sched.step_id += 1
        if s.tick(now) is not None:
            sent_at.append(now)
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert len(sent_at) >= 0.4 / GAP - 1 and min(gaps) >= GAP - 1e-9
