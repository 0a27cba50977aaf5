"""Admission against page reservations on every model, and the eviction order when admission is off."""

from __future__ import annotations

import pytest
from direct_cluster import Cluster
from fakes import ScriptedRouter, check_output

from tokenrouter.core.admission import Admission, PoolSize
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import LiveCount, Send
from tokenrouter.core.request import ReqStatus, Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import RequestTooLong, Scheduler
from tokenrouter.core.victims import victims


def _req(rid: str, prompt: int, out: int, seq: int = 0) -> Request:
    r = Request(rid, [1] * prompt, prompt, SamplingParams(max_tokens=out, ignore_eos=True), num_models=2)
    r.seq = seq
    return r


def test_ledger_reserves_worst_case_pages_on_every_model():
    adm = Admission([PoolSize(10, 4), PoolSize(5, 8)], growth_tokens=None)
    a = _req("a", 6, 10)  # 16 tokens: 4 pages of 4, 2 pages of 8
    assert adm.need(a) == (4, 2) and adm.try_reserve(a) and adm.reserved == [4, 2]
    assert adm.try_reserve(_req("b", 6, 10)) and adm.reserved == [8, 4]
    assert not adm.try_reserve(_req("c", 1, 8))  # 3 pages of 4 but 2 left on model 0: all or nothing
    assert adm.reserved == [8, 4] and adm.try_reserve(_req("d", 1, 3)) and adm.reserved == [9, 5]
    adm.release("a")
    assert adm.reserved == [5, 3] and adm.num_held == 2
    assert adm.fits_alone(_req("f", 30, 20)) == 0 and adm.fits_alone(_req("e", 4, 4)) is None


def test_reservations_follow_the_length_the_entry_saw_plus_headroom():
    adm = Admission([PoolSize(20, 4), PoolSize(8, 8)], growth_tokens=6)
    a = _req("a", 6, 30)  # 12 tokens reserved now (6 + 6 headroom), 36 at worst
    assert adm.try_reserve(a) and adm.reserved == [3, 2]
    a.token_ids.extend([2] * 9)  # the entry sees it at 15 tokens: 21 reserved
    adm.observe(a)
    assert adm.reserved == [6, 3]
    a.token_ids.extend([2] * 20)  # near the end: capped at the worst case, 36
    adm.observe(a)
    assert adm.reserved == [9, 5]
    assert not adm.try_reserve(_req("b", 20, 5))  # 25 tokens: 4 pages of 8, but 3 are left on model 1
    adm.release("a")
    assert adm.reserved == [0, 0] and adm.try_reserve(_req("b", 20, 5))


def test_requests_wait_at_admission_until_a_finish_frees_their_reservation():
    # 7 usable pages of 4 tokens per model; each request reserves 3 pages (12 tokens): two fit, the third waits.
    c = Cluster(pages=8, page_size=4, admission=True, router_script={(0, "a"): [1], (1, "a"): [0]})
    c.scheds[0].admission.growth_tokens = None
    for r in "abc":
        c.submit(r, [5, 6, 7, 8], max_tokens=8)
    entry, peer = c.scheds
    assert entry.active == peer.active == 2 and list(entry.admit_queue) == ["c"]
    assert entry.thresholds() == (1, 1)
    c.run()
    assert set(c.finished) == {"a", "b", "c"} and entry.active == peer.active == 0
    assert sum(s.num_preemptions for s in c.scheds) == 0
    for r in "abc":
        check_output(c.prompts[r], c.emitted[r])


def test_admission_from_the_queue_is_announced_with_the_finish():
    c = Cluster(pages=8, page_size=4, admission=True)
    c.scheds[0].admission.growth_tokens = None
    c.submit("a", [1, 2, 3, 4], max_tokens=8)
    c.submit("b", [1, 2, 3, 4], max_tokens=8)
    c.submit("c", [1, 2, 3, 4], max_tokens=8)
    entry, peer = c.scheds
    c.deliver(entry.abort("c"))  # a queued request leaves without any peer hearing of it
    assert c.finished == {"c": "abort"} and peer.active == 2
    c.submit("d", [1, 2, 3, 4], max_tokens=8)
    acts = entry.abort("a")  # frees a's reservation: d goes live; the finish carries the new count
    counts = [(a.msg.active, a.msg.epoch) for a in acts if isinstance(a, Send)]
    assert counts == [(entry.active, entry.epoch)] == [(2, 4)]
    assert not any(isinstance(a.msg, LiveCount) for a in acts if isinstance(a, Send))


def test_a_request_no_pool_of_the_deployment_can_hold_is_rejected_at_the_entry():
    adm = Admission([PoolSize(63, 4), PoolSize(3, 4)])
    s = Scheduler(0, 2, kv=KVPool(64, 4), router=Router(), admission=adm)
    with pytest.raises(RequestTooLong, match="model 1"):
        s.add(_req("x", 10, 4))
    with pytest.raises(ValueError, match="entry"):
        Scheduler(1, 2, kv=KVPool(8, 4), router=Router(), admission=adm)


def test_victims_are_younger_parked_then_younger_waiting_youngest_first():
    requester = _req("q", 1, 1, seq=5)
    reqs = []
    for rid, seq, status in [("p7", 7, "P"), ("p9", 9, "P"), ("p3", 3, "P"), ("w8", 8, "W"), ("w6", 6, "W"),
                             ("w2", 2, "W"), ("r9", 9, "R"), ("e9", 9, "W")]:  # fmt: skip
        r = _req(rid, 1, 1, seq=seq)
        r.status = {"P": ReqStatus.PENDING, "W": ReqStatus.WAITING, "R": ReqStatus.RUNNING}[status]
        r.pages = [] if rid == "e9" else [len(reqs) + 1]
        r.num_inflight = 1 if status == "R" else 0
        reqs.append(r)
    order = [r.rid for r in victims(reqs, requester, protected={id(reqs[4])})]
    assert order == ["p9", "p7", "w8"]  # w6 is in the batch; older ones, running ones and pageless ones never
    last_resort = [r.rid for r in victims(reqs, requester, protected=set(), any_age=True)]
    assert last_resort == ["p9", "p7", "p3", "w8", "w6", "w2"]


def test_a_returning_request_recomputes_from_the_first_token_the_peer_sent():
    """Router contract: tokens past `msg.loc` held here were never committed; if this model had computed KV
    for them, the KV anchor moves back to `loc` and the next row feeds from there."""
    c = Cluster(router_script={(0, "a"): [0, 0, 1], (1, "a"): [0]})
    c.submit("a", [1, 2, 3], max_tokens=8)
    for _ in range(3):
        c.step(0)
    small = c.scheds[0]
    msg = small.router.send(small.reqs["a"], 1)  # what a peer may send back: from position 3 on, rewritten
    msg.src, msg.dst, msg.loc, msg.tokens, msg.seen = 1, 0, 4, [77], [4, 5]
    req = small.reqs["a"]
    req.num_computed = 5  # say this model had computed the token at 4 under overlap
    small.resume(msg, c.now)
    assert req.num_computed == 4 and req.token_ids[4:] == [77]
    batch = small.schedule(c.now)
    assert [(r.start, r.num_tokens) for r in batch.rows] == [(4, 1)]


def test_context_length_is_checked_at_admission():
    """A request longer than the context (prompt + max_tokens) is refused when it arrives, whatever room the KV
    pools have; one at exactly the limit goes in and runs to its last token."""
    sched = Scheduler(0, 1, kv=KVPool(1024, 4), router=ScriptedRouter({}), max_context_len=40)

    def req(rid: str, prompt: int, out: int) -> Request:
        return Request(rid, [1] * prompt, prompt, SamplingParams(max_tokens=out, ignore_eos=True), num_models=1)

    with pytest.raises(RequestTooLong, match="context length 40"):
        sched.add(req("long", 30, 11))
    assert not sched.reqs and not sched.admit_queue
    sched.add(req("fits", 30, 10))
    assert "fits" in sched.reqs
