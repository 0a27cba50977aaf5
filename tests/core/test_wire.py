"""Peer messages on the wire, and messages as values (nothing shared with the sender)."""

from __future__ import annotations

import msgspec
import pytest
from direct_cluster import Cluster

from tokenrouter.core import wire
from tokenrouter.core.messages import LiveCount, PeerReq, Send
from tokenrouter.core.request import SamplingParams


def test_round_trip_keeps_every_field():
    req = PeerReq(
        "r1", 0, 1, tokens=[5, 6, 7], loc=3, prompt_len=2, seen=[6, 3], sampling=SamplingParams(0.7, 0.9, 20, 4, 99,
        (2, 3)), eos_token_ids=(1,), num_hops=2, seq=11, active=4, epoch=9, extras={"score": 0.25, "ids": [1, 2]},
    )  # fmt: skip
    for msg in (req, PeerReq("r2", 1, 0, finished=True, finish_reason="stop"), LiveCount(0, 2, 5, 17)):
        back = wire.decode(wire.encode(msg))
        assert type(back) is type(msg) and back == msg


def test_malformed_frames_are_errors():
    with pytest.raises(ValueError, match="unknown peer message kind"):
        wire.decode(msgspec.msgpack.encode(("nope", {})))
    with pytest.raises(msgspec.ValidationError):
        wire.decode(msgspec.msgpack.encode(("count", {"src": 0})))


def test_a_hand_off_message_shares_no_list_with_the_sender():
    c = Cluster(router_script={(0, "a"): [0, 1]})
    c.submit("a", [1, 2, 3], max_tokens=5)
    c.step(0)
    small = c.scheds[0]
    batch = small.schedule(c.now)
    acts = small.complete(batch, c.result_for(batch), c.now)
    (msg,) = [a.msg for a in acts if isinstance(a, Send)]
    req = small.reqs["a"]
    frozen = wire.encode(msg)
    assert msg.seen is not req.seen and msg.tokens is not req.token_ids
    req.seen[1] = -1  # the sender's later bookkeeping must not reach a message in flight
    req.token_ids.append(0)
    assert wire.encode(msg) == frozen
