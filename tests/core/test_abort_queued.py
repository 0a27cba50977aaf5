"""Abort of a request that still waits at admission (it never went live): one Finish, no token, no peer told,
and it is gone from the queue, so it neither runs later nor finishes a second time."""

from __future__ import annotations

from direct_cluster import Cluster

from tokenrouter.core.messages import Finish, Send


def test_aborting_a_request_queued_at_admission_ends_it_once_and_it_never_runs():
    # 7 usable pages of 4 tokens per model; each request reserves 3 pages: two go live, "c" waits.
    c = Cluster(pages=8, page_size=4, admission=True)
    c.scheds[0].admission.growth_tokens = None
    finishes: list[tuple[str, str]] = []
    deliver = c.deliver

    def counting(actions) -> None:
        finishes.extend((a.rid, a.reason) for a in actions if isinstance(a, Finish))
        deliver(actions)

    c.deliver = counting
    for r in "abc":
        c.submit(r, [5, 6, 7, 8], max_tokens=8)
    entry = c.scheds[0]
    assert list(entry.admit_queue) == ["c"] and entry.active == 2
    acts = entry.abort("c", c.now)
    assert [(a.rid, a.reason, a.num_output) for a in acts if isinstance(a, Finish)] == [("c", "abort", 0)]
    assert not any(isinstance(a, Send) for a in acts)  # no peer ever heard of it
    c.deliver(acts)
    assert "c" not in entry.admit_queue and "c" not in entry.reqs
    c.run()  # "a" and "b" finish and free their reservations: nothing may admit "c" now
    assert sorted(finishes) == [("a", "length"), ("b", "length"), ("c", "abort")]
    assert "c" not in c.emitted and entry.active == 0 and not entry.admit_queue
    assert entry.abort("c", c.now) == []  # a second abort finds nothing
