from __future__ import annotations

import pytest
from direct_cluster import Cluster
from fakes import check_output

from tokenrouter.core.batch import StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Send
from tokenrouter.core.policy import Policy, PolicyKind
from tokenrouter.core.request import ReqStatus, Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import RequestTooLong, Scheduler


def free_all(c: Cluster) -> bool:
    return all(s.kv.num_free == s.kv.num_pages - 1 for s in c.scheds)


def test_single_model_lifecycle_prefill_then_decode():
    c = Cluster()
    c.submit("a", [1, 2, 3, 4, 5], max_tokens=3)
    c.run()
    sizes = [(b.model, [(r.start, r.num_tokens) for r in b.rows]) for b in c.batches]
    assert sizes == [(0, [(0, 5)]), (0, [(5, 1)]), (0, [(6, 1)])]
    assert [p for p, _, _ in c.emitted["a"]] == [0, 1, 2]
    assert c.finished == {"a": "length"}
    assert free_all(c) and c.scheds[0].active == 0


def test_handoff_parks_request_with_kv_and_resumes_with_short_extend():
    # small hops after its 2nd step; the large writes one token and hands back (R2R semantics).
    c = Cluster(router_script={(0, "a"): [0, 1], (1, "a"): [0]})
    c.submit("a", [1, 2, 3, 4, 5, 6], max_tokens=4)
    small, large = c.scheds
    c.step(0)  # prefill 6, emits token 0, stays
    c.step(0)  # decode, samples token 1 -> hop, dropped
    req = small.reqs["a"]
    assert req.status == ReqStatus.PENDING
    assert req.num_computed == 7 and len(req.pages) == 2  # KV kept while parked
    assert req.token_ids[-1] == c.emitted["a"][-1][1]  # dropped sample is gone
    assert large.reqs["a"].token_ids == req.token_ids and large.reqs["a"].num_computed == 0
    b = c.step(1)  # the large prefills the whole sequence (first visit) and writes output 1
    assert [(r.start, r.num_tokens) for r in b.rows] == [(0, 7)]
    assert c.emitted["a"][-1][2] == 1 and c.emitted["a"][-1][0] == 1
    assert large.reqs["a"].status == ReqStatus.PENDING and large.reqs["a"].pages
    b = c.step(0)  # back home: a 1-token row that appends the large's token, no recompute
    assert [(r.start, r.num_tokens) for r in b.rows] == [(7, 1)]
    c.run()
    assert [p for p, _, _ in c.emitted["a"]] == [0, 1, 2, 3]
    assert [m for _, _, m in c.emitted["a"]] == [0, 1, 0, 0]
    check_output(c.prompts["a"], c.emitted["a"])
    assert c.finished == {"a": "length"}
    assert free_all(c)


def test_multi_token_return_is_an_extend_row():
    # R-Stitch-like: the large keeps writing 3 tokens, then hands back.
    c = Cluster(router_script={(0, "a"): [1], (1, "a"): [1, 1, 0]})
    c.submit("a", [7, 7, 7], max_tokens=6)
    c.run()
    small_rows = [(r.start, r.num_tokens) for b in c.batches if b.model == 0 for r in b.rows]
    assert small_rows[1] == (3, 3)  # the three tokens the large wrote, fed in one extend row
    assert [m for _, _, m in c.emitted["a"]] == [1, 1, 1, 0, 0, 0]
    check_output(c.prompts["a"], c.emitted["a"])
    assert free_all(c)


def test_finish_on_peer_frees_kv_everywhere_and_updates_count():
    c = Cluster(router_script={(0, "a"): [1], (1, "a"): [1, 1]})
    c.submit("a", [1, 2], max_tokens=3)
    c.run()
    assert c.finished == {"a": "length"}
    assert [m for _, _, m in c.emitted["a"]] == [1, 1, 1]
    assert free_all(c)
    assert [s.active for s in c.scheds] == [0, 0]
    assert not c.scheds[0].reqs and not c.scheds[1].reqs


def test_delayed_waits_for_threshold_and_guard_clamps_for_low_concurrency():
    script = {(0, r): [1] for r in "abcd"}
    c = Cluster(policy=Policy("delayed", thresholds=(1, 3)), router_script=script)
    for r in "abcd":
        c.submit(r, [1, 2], max_tokens=2)
    assert c.scheds[0].thresholds() == (1, 3)
    c.step(0)  # all four hop to the large
    large = c.scheds[1]
    assert len(large.waiting) == 4
    # Only two live requests: B=(1,3) would break sum(B-1) < N, so the large drops to 2.
    for r in "ab":
        c.deliver(c.scheds[0].abort(r))
    assert c.scheds[1].active == 2 and large.thresholds() == (1, 2)
    c.run()
    assert set(c.finished) == {"a", "b", "c", "d"} and free_all(c)


def test_delayed_holds_batch_below_threshold():
    c = Cluster(policy=Policy("delayed", thresholds=(1, 3)), router_script={(0, r): [0, 1] for r in "abcd"})
    for r in "abcd":
        c.submit(r, [1], max_tokens=4)
    c.step(0)
    c.step(0)  # every request hops now
    large = c.scheds[1]
    assert len(large.waiting) == 4 and large.thresholds() == (1, 3)
    c.deliver(c.scheds[0].abort("a"))
    c.deliver(c.scheds[0].abort("b"))
    # N=2 now: clamped thresholds (1, 2) let the two left launch together
    b = large.schedule(0.0)
    assert b is not None and len(b) == 2


def test_policy_rejects_bad_thresholds():
    with pytest.raises(ValueError, match="deadlock guard"):
        Policy("delayed", table={4: (3, 3)})
    with pytest.raises(ValueError, match="unknown policy"):
        Policy("fastest")
    with pytest.raises(ValueError, match=">= 1"):
        Policy("delayed", thresholds=(0, 2))


def test_kv_exhaustion_preempts_and_recomputes_never_drops():
    # 5 usable pages of 4 tokens = 20 tokens; two requests of 8 + 8 tokens cannot both stay resident.
    c = Cluster(pages=6, page_size=4)
    c.submit("a", list(range(8)), max_tokens=8)
    c.submit("b", list(range(8)), max_tokens=8)
    c.run()
    assert set(c.finished) == {"a", "b"}
    for rid in "ab":
        assert [p for p, _, _ in c.emitted[rid]] == list(range(8))
    assert c.scheds[0].num_preemptions > 0
    assert free_all(c)


def test_pending_request_is_preempted_first_and_recomputes_on_return():
    c = Cluster(pages=6, page_size=4, router_script={(0, "a"): [1], (1, "a"): [0]})
    c.submit("a", list(range(8)), max_tokens=3)
    c.step(0)  # a: prefill 8 (2 pages), hops to the large, parked with its pages
    a = c.scheds[0].reqs["a"]
    assert a.status == ReqStatus.PENDING and len(a.pages) == 2
    c.submit("b", list(range(12)), max_tokens=8)  # b needs 5 pages over its life
    for _ in range(6):
        c.step(0)
    assert a.pages == [] and a.num_computed == 0 and a.num_preemptions == 1
    c.run()
    a_rows = [(r.start, r.num_tokens) for b in c.batches if b.model == 0 for r in b.rows if r.req.rid == "a"]
    assert (0, 9) in a_rows  # recomputed from scratch: prompt + the large's token
    assert set(c.finished) == {"a", "b"} and free_all(c)


def test_request_larger_than_pool_is_rejected():
    s = Scheduler(0, 2, kv=KVPool(3, 4), router=Router())
    with pytest.raises(RequestTooLong):
        s.add(Request("x", [1] * 6, 6, SamplingParams(max_tokens=4), num_models=2))


def test_abort_frees_kv_on_both_sides():
    c = Cluster(router_script={(0, "a"): [1], (1, "a"): [0]})
    c.submit("a", [1, 2, 3], max_tokens=50)
    c.step(0)
    c.step(1)
    c.deliver(c.scheds[0].abort("a"))
    assert c.finished == {"a": "abort"} and free_all(c)


def test_overlap_drops_row_that_hopped_from_prepared_batch():
    c = Cluster(router_script={(0, "a"): [0, 1], (1, "a"): [0]}, overlap=True)
    c.submit("a", [1, 2], max_tokens=5)
    c.submit("b", [3, 4], max_tokens=5)
    small = c.scheds[0]
    k0 = small.schedule(0.0)
    c.deliver(small.complete(k0, c.result_for(k0), 1.0))
    k1 = small.schedule(1.0)
    k2 = small.schedule(1.0)  # prepared while k1 is in flight
    assert k2 is not None and all(r.from_prev for r in k2.rows) and len(k2) == 2
    assert small.schedule(1.0) is None  # at most one batch prepared ahead
    c.deliver(small.complete(k1, c.result_for(k1), 2.0))  # "a" hops away here
    assert small.reqs["a"].status == ReqStatus.PENDING
    acts = small.complete(k2, c.result_for(k2), 3.0)
    assert {a.rid for a in acts if hasattr(a, "tokens")} == {"b"}  # a's row in k2 was dropped
    assert small.reqs["a"].num_computed == 3  # not advanced by the stale row
    c.deliver(acts)
    c.run()
    for rid in "ab":
        assert [p for p, _, _ in c.emitted[rid]] == list(range(5))
        check_output(c.prompts[rid], c.emitted[rid])
    assert free_all(c)


def test_complete_out_of_order_is_an_error():
    c = Cluster()
    c.submit("a", [1], max_tokens=2)
    b = c.scheds[0].schedule(0.0)
    with pytest.raises(ValueError):
        c.scheds[1].complete(b, StepResult([1]))


def test_model_sync_never_runs_two_models_at_once():
    script = {(0, r): [1, 0, 1] for r in "abc"} | {(1, r): [0, 0] for r in "abc"}
    c = Cluster(policy=Policy("model-sync"), router_script=script)
    for r in "abc":
        c.submit(r, [1, 2], max_tokens=6)
    small, large = c.scheds
    b0 = small.schedule(0.0)
    assert b0 is not None and large.schedule(0.0) is None
    c.deliver(small.complete(b0, c.result_for(b0)))
    c.run()
    assert set(c.finished) == {"a", "b", "c"} and free_all(c)


def test_step_sync_round_barrier():
    c = Cluster(policy=Policy("step-sync"), router_script={(0, "a"): [1], (1, "a"): [0]})
    c.submit("a", [1], max_tokens=4)
    c.submit("b", [1], max_tokens=4)
    small, large = c.scheds
    b0 = small.schedule(0.0)  # round 1: only the small has work
    assert b0 is not None and small.schedule(0.0) is None
    c.deliver(small.complete(b0, c.result_for(b0)))
    # round 2: both have work and both launch; neither launches again until both complete
    b_small, b_large = small.schedule(1.0), large.schedule(1.0)
    assert b_small is not None and b_large is not None
    c.deliver(small.complete(b_small, c.result_for(b_small)))
    assert small.schedule(2.0) is None  # the large is still running: barrier
    c.deliver(large.complete(b_large, c.result_for(b_large)))
    assert small.schedule(3.0) is not None


def test_sync_policy_needs_gate():
    with pytest.raises(ValueError, match="SyncGate"):
        Scheduler(0, 2, kv=KVPool(8, 4), router=Router(), policy=Policy("step-sync"))


def test_std_serving_is_a_driver_mode_not_a_core_policy():
    with pytest.raises(ValueError, match="unknown policy 'std-serving'"):
        Policy("std-serving")
    assert Policy("delayed").kind is PolicyKind.DELAYED and PolicyKind("model-sync").is_sync


def test_peer_message_wire_carries_only_unseen_suffix():
    c = Cluster(router_script={(0, "a"): [0, 0, 1, 0, 0, 1], (1, "a"): [0, 0]})
    c.submit("a", [5, 6, 7], max_tokens=8)
    sent: list = []
    orig = c.deliver

    def spy(actions):
        sent.extend(a for a in actions if isinstance(a, Send) and not a.msg.finished)
        orig(actions)

    c.deliver = spy
    c.run()
    to_large = [a.msg for a in sent if a.peer == 1]
    assert to_large[0].loc == 0 and to_large[0].sampling is not None
    assert to_large[1].loc > 0 and to_large[1].sampling is None
    assert to_large[1].loc == to_large[0].loc + len(to_large[0].tokens) + 1  # + the large's own token


def test_max_wait_launches_under_threshold_after_the_deadline():
    c = Cluster(policy=Policy("delayed", thresholds=(1, 3), max_wait=0.5), router_script={(0, r): [1] for r in "ab"})
    for r in "abcd":
        c.submit(r, [1], max_tokens=4)
    small, large = c.scheds
    b = small.schedule(0.0)
    c.now = 1.0
    c.deliver(small.complete(b, c.result_for(b), 1.0))  # a and b hop; c and d stay
    assert len(large.waiting) == 2 and large.thresholds() == (1, 3)
    assert large.schedule(1.2) is None
    assert large.next_deadline() == pytest.approx(1.5)
    batch = large.schedule(1.5)
    assert batch is not None and len(batch) == 2
