"""Overlap: step k+1 prepared while step k runs, `from_prev` rows, and requests that leave and come back
inside one prepare-ahead window."""

from __future__ import annotations

from direct_cluster import Cluster
from fakes import check_output

from tokenrouter.core.request import ReqStatus


def test_request_that_hops_away_and_back_inside_the_window_commits_once():
    # "a" hops to the large model at its first step and comes straight back; "b" stays on the small one.
    c = Cluster(router_script={(0, "a"): [1], (1, "a"): [0]}, overlap=True)
    c.submit("a", [1, 2, 3], max_tokens=6)
    c.submit("b", [4, 5], max_tokens=6)
    small = c.scheds[0]
    k = small.schedule(0.0)
    k1 = small.schedule(0.0)  # prepared while k runs: both rows continue from k's samples
    assert k1 is not None and [r.from_prev for r in k1.rows] == [True, True]
    res_k, res_k1 = c.result_for(k), c.result_for(k1)  # the device runs them in launch order
    c.deliver(small.complete(k, res_k, 1.0))  # "a" hops away: its row in k1 is now stale
    assert small.reqs["a"].status == ReqStatus.PENDING
    c.step(1)  # the large writes one token and hands "a" back, while k1 still runs
    assert small.reqs["a"].status == ReqStatus.WAITING
    k2 = small.schedule(2.0)  # prepared while k1 runs: "b" continues k1, "a" feeds the large's token
    rows = {r.req.rid: r for r in k2.rows}
    assert rows["b"].from_prev and not rows["a"].from_prev and rows["a"].num_tokens == 1
    res_k2 = c.result_for(k2)
    c.deliver(small.complete(k1, res_k1, 3.0))  # a's stale row must not commit
    assert small.reqs["a"].num_computed == 3 and c.emitted["a"] == [(0, c.emitted["a"][0][1], 1)]  # the large's
    c.deliver(small.complete(k2, res_k2, 4.0))
    c.run()
    for rid in "ab":
        assert [p for p, _, _ in c.emitted[rid]] == list(range(6))
        check_output(c.prompts[rid], c.emitted[rid])
    assert c.finished == {"a": "length", "b": "length"}


def test_no_row_is_prepared_for_a_request_whose_running_row_writes_its_last_token():
    c = Cluster(overlap=True)
    c.submit("a", [1, 2], max_tokens=2)
    c.submit("b", [3], max_tokens=5)
    small = c.scheds[0]
    k = small.schedule(0.0)
    c.deliver(small.complete(k, c.result_for(k), 1.0))  # one token each; "a" has one left to write
    k1 = small.schedule(1.0)
    k2 = small.schedule(1.0)
    assert [r.req.rid for r in k1.rows] == ["a", "b"] and [r.req.rid for r in k2.rows] == ["b"]
    res1, res2 = c.result_for(k1), c.result_for(k2)
    c.deliver(small.complete(k1, res1, 2.0))
    c.deliver(small.complete(k2, res2, 3.0))
    c.run()
    for rid in "ab":
        check_output(c.prompts[rid], c.emitted[rid])


def test_no_row_is_prepared_for_a_request_the_router_says_surely_leaves():
    # R2R's large model hands back after every token: a row prepared ahead there would always be wasted.
    c = Cluster(overlap=True)
    c.submit("a", [1, 2], max_tokens=5)
    small = c.scheds[0]
    small.router.may_stay = lambda req: req.rid != "a"
    assert small.schedule(0.0) is not None and small.schedule(0.0) is None
    from tokenrouter.core.hop_law import geometric_run
    from tokenrouter.routers import synthetic_router

    large, entry = synthetic_router(geometric_run(0.1)).bind(1, 2), synthetic_router(geometric_run(0.1)).bind(0, 2)
    assert not large.may_stay(small.reqs["a"]) and entry.may_stay(small.reqs["a"])


def test_sync_policies_never_prepare_ahead():
    from tokenrouter.core.policy import Policy

    c = Cluster(policy=Policy("model-sync"), overlap=True)
    c.submit("a", [1], max_tokens=4)
    small = c.scheds[0]
    assert small.schedule(0.0) is not None and small.schedule(0.0) is None


def test_a_sync_gate_turns_overlap_off():
    from tokenrouter.core.policy import Policy

    gated = Cluster(policy=Policy("step-sync"), overlap=True)
    free = Cluster(overlap=True)
    for c in (gated, free):
        c.submit("a", [1, 2, 3], max_tokens=4)
        c.submit("b", [4, 5], max_tokens=4)
    g, f = gated.scheds[0], free.scheds[0]
    assert g.overlap and not g.prepares_ahead and f.prepares_ahead
    assert g.schedule(0.0) is not None and f.schedule(0.0) is not None
    assert g.schedule(0.0) is None  # one batch in flight under a gate, even with overlap asked for
    nxt = f.schedule(0.0)
    assert nxt is not None and all(r.from_prev for r in nxt.rows)
