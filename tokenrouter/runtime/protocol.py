"""Front-end <-> subserver messages in `[channel, payload]` frames (docs/runtime.md). Invariants: `Submit` goes to the
entry only; a request's `Tokens` come from any subserver in any order, then one `Finished` or `Rejected`; `Ready`
once, `Stats` as the heartbeat, `Failed` before a fatal exit."""

from __future__ import annotations

import dataclasses
import typing
from array import array

import msgspec

from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.core.config import PolicyConfig
from tokenrouter.core.request import SamplingParams

PEER = b"peer"
CTL = b"ctl"
GATE = b"gate"  # a grant from the sync coordinator
JOIN = b"join"  # tcp only: joining the launcher (`runtime.join`), kept off CTL so its decoders stay as they are


def pack_ids(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_ids(data: bytes) -> list[int]:
    return array("i", data).tolist()


def _wire_struct(cls: type, name: str, doc: str) -> type[msgspec.Struct]:
    """A frozen msgspec struct with exactly the fields, types and defaults of the dataclass `cls` (no drift)."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = msgspec.field(default_factory=f.default_factory)
        else:
            fields.append((f.name, hints[f.name]))
            continue
        fields.append((f.name, hints[f.name], default))
    struct = msgspec.defstruct(name, fields, frozen=True, module=__name__)
    struct.__doc__ = doc
    return struct


Sampling = _wire_struct(SamplingParams, "Sampling", """`SamplingParams` on the wire without its validation, so a bad
    value is answered with `Rejected(400)` instead of failing the decode of the whole frame.""")  # fmt: skip


class Submit(msgspec.Struct, tag="submit", frozen=True):
    rid: str
    prompt_ids: bytes  # pack_ids
    sampling: Sampling
    eos_token_ids: tuple[int, ...] = ()


class Abort(msgspec.Struct, tag="abort", frozen=True):
    rid: str


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    pass


class Restarted(msgspec.Struct, tag="restarted", frozen=True):
    """Launcher -> the survivors when `model` restarts: drop every request and reconnect to it."""

    model: int


class SetPolicy(msgspec.Struct, tag="set_policy", frozen=True):
    """Front-end -> every subserver: the policy to run and, for a synthetic router, a hop rate (None: keep it);
    applied between steps and acknowledged (`PolicySet`)."""

    seq: int
    policy: PolicyConfig
    hop_rate: float | None = None


class Tokens(msgspec.Struct, tag="tokens", frozen=True):
    rid: str
    pos: int  # output index of the first token
    ids: bytes  # pack_ids
    model: int
    logprobs: list[TokenLogprobs | None] | None = None


class Finished(msgspec.Struct, tag="finished", frozen=True):
    rid: str
    reason: str  # "stop" | "length" | "abort" | "error"
    num_output: int
    num_hops: int = 0


class Rejected(msgspec.Struct, tag="rejected", frozen=True):
    """The request never ran: `status` is the HTTP status the front-end answers with."""

    rid: str
    status: int
    message: str


class Ready(msgspec.Struct, tag="ready", frozen=True):
    model: int
    name: str
    kv_capacity_tokens: int
    max_context_len: int
    vocab_size: int
    startup_s: float


class Stats(msgspec.Struct, tag="stats", frozen=True):
    model: int
    time: float  # the subserver's monotonic clock
    kv_pages_used: int
    kv_pages_total: int
    running: int
    waiting: int
    pending: int
    steps: int  # cumulative
    step_rows: int  # cumulative rows over all steps (mean batch size = step_rows / steps)
    step_ms: float  # cumulative step time
    tokens: int  # cumulative committed tokens written by this model
    hops: int  # cumulative hand-offs sent
    loop_steps: int = 0  # the `loop_*` and `busy_ms` fields: `runtime.stats.Counters`
    loop_rows: int = 0
    loop_ms: float = 0.0
    loop_gpu_ms: float = 0.0
    busy_ms: float = 0.0
    batch_steps: list[int] = []  # per batch-size bucket (`core.autotune_counters`): steps, rows, their busy share
    batch_rows: list[int] = []
    batch_ms: list[float] = []
    live: int = 0  # live requests N as this subserver knows it (the entry owns the count)
    prefix_requests: int = 0  # the `prefix_*` fields: a std-serving model server's cache (`baselines.kv`), else 0
    prefix_hits: int = 0
    prefix_prompt_tokens: int = 0
    prefix_matched_tokens: int = 0
    prefix_evicted_pages: int = 0
    prefix_host_ms: float = 0.0
    prefix_cached_pages: int = 0


class Failed(msgspec.Struct, tag="failed", frozen=True):
    model: int
    message: str


class PolicySet(msgspec.Struct, tag="policy_set", frozen=True):
    """A subserver applied (`error` None) or refused a `SetPolicy`."""

    model: int
    seq: int
    error: str | None = None


ToSubserver = Submit | Abort | Shutdown | Restarted | SetPolicy
ToFrontend = Tokens | Finished | Rejected | Ready | Stats | Failed | PolicySet

_enc = msgspec.msgpack.Encoder()
_dec_sub = msgspec.msgpack.Decoder(ToSubserver)
_dec_front = msgspec.msgpack.Decoder(ToFrontend)


def encode(msg: ToSubserver | ToFrontend) -> bytes:
    return _enc.encode(msg)


def decode_for_subserver(data: bytes) -> ToSubserver:
    return _dec_sub.decode(data)


def decode_for_frontend(data: bytes) -> ToFrontend:
    return _dec_front.decode(data)
