"""Messages that arrive after their request ended: an abort at the entry crossing a return from the peer, and a
hand-off overtaken by the finish on another link. Both must be dropped, not crash a subserver or re-run the
request; a message for a request nobody knows of is still an error."""

from __future__ import annotations

import pytest
from fakes import FakeExecutor, ScriptedRouter

from tokenrouter.core import wire
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import PeerReq, Send
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import Scheduler


def pair(script):
    pools = [KVPool(64, 4), KVPool(64, 4)]
    return [Scheduler(m, 2, kv=pools[m], router=ScriptedRouter(script)) for m in range(2)], pools


def sends(actions, peer):
    return [wire.decode(wire.encode(a.msg)) for a in actions if isinstance(a, Send) and a.peer == peer]


def test_abort_at_the_entry_crossing_a_return_is_dropped():
    (s0, s1), pools = pair({(0, "r"): [1], (1, "r"): [0]})
    ex0, ex1 = FakeExecutor(0), FakeExecutor(1)
    req = Request("r", [1, 2, 3], 3, SamplingParams(max_tokens=10, ignore_eos=True), num_models=2)
    for m in sends(s0.add(req, 0.0), 1):
        s1.resume(m, 0.0)
    b = s0.schedule(0.0)
    hand_off = sends(s0.complete(b, ex0.run(b), 1.0), 1)  # the small model hops: the request goes to model 1
    assert len(hand_off) == 1
    s1.resume(hand_off[0], 1.0)
    b1 = s1.schedule(1.0)
    back = sends(s1.complete(b1, ex1.run(b1), 2.0), 0)  # model 1 writes its token and hands back...
    assert back and back[0].loc > 0
    abort = s0.abort("r", 2.0)  # ...while the client's abort reaches the entry first
    assert pools[0].num_free == pools[0].num_pages - 1
    assert s0.resume(back[0], 3.0) == []  # the late return is dropped: no crash, nothing re-queued
    assert "r" not in s0.reqs and s0.schedule(3.0) is None
    for m in sends(abort, 1):
        s1.resume(m, 3.0)
    assert pools[1].num_free == pools[1].num_pages - 1 and "r" not in s1.reqs


def test_hand_off_overtaken_by_the_finish_does_not_run():
    (_, s1), _ = pair({})
    late = PeerReq("x", src=0, dst=1, tokens=[1, 2, 3], loc=0, prompt_len=3, seen=[3, 0],
                   sampling=SamplingParams(max_tokens=4))  # fmt: skip
    s1.resume(PeerReq("x", src=0, dst=1, finished=True, finish_reason="abort"), 0.0)
    assert s1.resume(late, 0.0) == [] and "x" not in s1.reqs and s1.schedule(0.0) is None


def test_unknown_request_mid_sequence_is_still_an_error():
    (s0, _), _ = pair({})
    with pytest.raises(ValueError, match="whole sequence"):
        s0.resume(PeerReq("nobody", src=1, dst=0, tokens=[5], loc=7, seen=[7, 8]), 0.0)
