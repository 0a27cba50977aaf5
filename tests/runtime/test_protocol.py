"""Front-end <-> subserver messages survive an encode/decode round trip; token ids travel as int32 bytes."""

from __future__ import annotations

import msgspec
import pytest

from tokenrouter.core.config import PolicyConfig
from tokenrouter.runtime import protocol as P


def test_ids_round_trip_as_int32_bytes():
    ids = [0, 1, 151935, 2**31 - 1, 7]
    data = P.pack_ids(ids)
    assert len(data) == 4 * len(ids)
    assert P.unpack_ids(data) == ids


@pytest.mark.parametrize(
    "msg",
    [
        P.Submit("r1", P.pack_ids([1, 2, 3]), P.Sampling(temperature=0.7, top_k=5, seed=3, max_tokens=9), (2,)),
        P.Abort("r1"),
        P.Shutdown(),
    ],
)
def test_subserver_messages_round_trip(msg):
    assert P.decode_for_subserver(P.encode(msg)) == msg


@pytest.mark.parametrize(
    "msg",
    [
        P.Tokens("r1", 4, P.pack_ids([9, 8]), 1),
        P.Finished("r1", "length", 12, 3),
        P.Rejected("r2", 400, "prompt too long"),
        P.Ready(0, "tiny-small", 1000, 2048, 1024, 0.5),
        P.Stats(1, 3.5, 10, 100, 2, 1, 0, 50, 400, 120.0, 380, 12),
        P.Stats(
            1,
            3.5,
            10,
            100,
            2,
            1,
            0,
            50,
            400,
            120.0,
            380,
            12,
            batch_steps=[3, 0, 1],
            batch_rows=[3, 0, 3],
            batch_ms=[1.5, 0.0, 2.25],
            live=7,
        ),
        P.Failed(1, "CUDA error"),
    ],
)
def test_frontend_messages_round_trip(msg):
    assert P.decode_for_frontend(P.encode(msg)) == msg


def test_set_policy_carries_the_config_section_and_is_checked_on_decoding():
    pc = PolicyConfig("delayed", [1, 3], {1: [1, 1], 8: [1, 6]}, max_wait_ms=2.5)
    msg = P.SetPolicy(4, pc, hop_rate=0.2)
    assert P.decode_for_subserver(P.encode(msg)) == msg
    bad = {"type": "set_policy", "seq": 5, "policy": {"kind": "delayed", "table": {8: [1, 9]}}}
    with pytest.raises(msgspec.ValidationError, match="deadlock guard"):
        P.decode_for_subserver(msgspec.msgpack.encode(bad))  # a row breaking the guard never reaches a scheduler


def test_a_frontend_event_is_not_a_subserver_command():
    with pytest.raises(msgspec.ValidationError):
        P.decode_for_subserver(P.encode(P.Finished("r", "stop", 1)))


def test_sampling_on_the_wire_is_sampling_params_field_for_field():
    """The subserver rebuilds `SamplingParams(**wire fields)`: names, order and defaults must be the dataclass's."""
    import dataclasses

    from tokenrouter.core.request import SamplingParams

    fields = dataclasses.fields(SamplingParams)
    assert P.Sampling.__struct_fields__ == tuple(f.name for f in fields)
    wire, params = P.Sampling(), SamplingParams()
    assert all(getattr(wire, f.name) == getattr(params, f.name) for f in fields)
    custom = P.Sampling(temperature=0.7, top_p=0.9, top_k=5, seed=3, max_tokens=9, stop_token_ids=(4,), ignore_eos=True)
    back = P.decode_for_subserver(P.encode(P.Submit("r", P.pack_ids([1]), custom, ()))).sampling
    assert SamplingParams(**{f.name: getattr(back, f.name) for f in fields}) == SamplingParams(
        temperature=0.7, top_p=0.9, top_k=5, seed=3, max_tokens=9, stop_token_ids=(4,), ignore_eos=True
    )


def test_stats_from_a_sender_without_the_autotune_fields_decode_with_defaults():
    """A subserver that predates the per-batch-size counters sends Stats without them: they decode as empty."""
    old = msgspec.msgpack.encode({"type": "stats", "model": 0, "time": 1.0, "kv_pages_used": 1, "kv_pages_total": 9,
                                  "running": 0, "waiting": 0, "pending": 0, "steps": 2, "step_rows": 4,
                                  "step_ms": 3.0, "tokens": 4, "hops": 1})  # fmt: skip
    got = P.decode_for_frontend(old)
    assert isinstance(got, P.Stats) and got.batch_steps == [] and got.batch_ms == [] and got.live == 0
