"""What rank 0 of a tensor-parallel engine sends its followers, and the loop a follower runs (docs/tensor-parallel.md).
A `StepDesc` is a planned step's packed inputs and how to run them; followers replay it through rank 0's launch code
(`Engine.run_described`). Transport: `tokenrouter.runtime.tp_ranks`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec
import numpy as np

if TYPE_CHECKING:
    from tokenrouter.engine.parallel import TensorParallel
    from tokenrouter.engine.plan_types import PartPlan, StepPlan

log = logging.getLogger(__name__)


class PartDesc(msgspec.Struct, array_like=True, frozen=True):
    """One pass: `size` int32 words of `StepDesc.packed`; `bucket` of its graph, or None with the eager `layout`
    (tokens, attention rows, logit rows, updates); `extra_upd`: int64 [2, n] page writes before a replay."""

    size: int
    bucket: int | None
    layout: tuple[int, int, int, int] | None
    max_q_len: int
    extra_upd: bytes | None = None


class StepDesc(msgspec.Struct, tag="step", array_like=True, frozen=True):
    step_id: int
    packed: bytes  # int32 little-endian: graph pass inputs, then varlen pass inputs
    graph: PartDesc | None
    eager: PartDesc | None
    logprobs: bool  # some row asks for log-probabilities


class Recapture(msgspec.Struct, tag="recapture", array_like=True, frozen=True):
    pdl: bool
    gemv: tuple[bool, int, bool] | None  # skinny GEMM (enabled, max_rows, prefetch); None: not attached


class Stop(msgspec.Struct, tag="stop", array_like=True, frozen=True):
    pass


Message = StepDesc | Recapture | Stop
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


class FollowerEngine(Protocol):
    """`runner.Engine` on rank r > 0 (a protocol: the runner imports this module)."""

    tp: TensorParallel

    def run_described(self, desc: StepDesc) -> None: ...

    def apply_recapture(self, msg: Recapture) -> None: ...


class StepSink(Protocol):
    """Rank 0's side of the transport: every message goes to every follower, in order."""

    def publish(self, data: bytes) -> None: ...

    def close(self) -> None:
        """After `Stop` was published: wait for the followers to end (or end them)."""


def _part(p: PartPlan | None) -> PartDesc | None:
    if p is None:
        return None
    layout = None
    if p.bucket is None:
        lay = p.layout
        layout = (lay.num_tokens, lay.num_attn_rows, lay.num_logit_rows, lay.num_updates)
    extra = None if p.extra_upd is None else np.stack(p.extra_upd).astype(np.int64).tobytes()
    return PartDesc(p.layout.size, p.bucket, layout, p.max_q_len, extra)


def describe(step_id: int, plan: StepPlan, staged: np.ndarray) -> StepDesc:
    """The description of a planned step; `staged`: the int32 staging buffer the plan packed its passes into."""
    g = plan.graph.layout.size if plan.graph is not None else 0
    e = plan.eager.layout.size if plan.eager is not None else 0
    packed = np.ascontiguousarray(staged[: g + e], dtype="<i4").tobytes()
    return StepDesc(step_id, packed, _part(plan.graph), _part(plan.eager), bool(plan.logprobs))


def extra_updates(part: PartDesc) -> tuple[np.ndarray, np.ndarray] | None:
    if part.extra_upd is None:
        return None
    a = np.frombuffer(part.extra_upd, np.int64).reshape(2, -1)
    return a[0], a[1]


def follow(engine: FollowerEngine, recv: Callable[[], bytes]) -> int:
    """A follower's loop: run every message until `Stop`; returns the steps run. Errors propagate."""
    steps = 0
    while True:
        msg = decode(recv())
        if isinstance(msg, StepDesc):
            engine.run_described(msg)
            steps += 1
        elif isinstance(msg, Recapture):
            engine.apply_recapture(msg)
        else:
            log.info("rank %d: stop after %d steps", engine.tp.rank, steps)
            return steps
