"""The runtime's `EngineLoop` in one process, without sockets (tests, `studies/engine/serving_loop.py`): model 1
is an `EchoPeer` and the router a deterministic `PositionHopRouter`, so hops happen without a second engine."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import Action, Finish, PeerReq, Send
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.runtime.engine_loop import EngineLoop


def _mix(*xs: int) -> int:
    h = 0x9E3779B9
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
    return h


def _rid_key(rid: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(rid))


class PositionHopRouter(Router):
    """A sampled row hops to model 1 (its token dropped) when a hash of (request, position) hits 1 in `period`:
    overlap, batch composition and timing never change a decision."""

    name = "position-hop"

    def __init__(self, period: int = 5) -> None:
        super().__init__()
        self.period = period

    def route(self, batch: Batch, result: StepResult) -> list[int]:
        return [1 if row.sample and _mix(_rid_key(row.req.rid), row.start + row.num_tokens) % self.period == 0
                else self.model for row in batch.rows]  # fmt: skip


class EchoPeer:
    """Model 1 without a model: a request sent to it comes back `delay` receive calls later with 2-4 tokens
    (a peer return: an extend row), each a hash of (request, position) modulo `vocab`."""

    def __init__(self, vocab: int, delay: int = 1) -> None:
        self.vocab, self.delay = vocab, delay
        self.queue: deque[tuple[int, PeerReq]] = deque()
        self.clock = 0

    def send(self, msg: PeerReq) -> None:
        if msg.finished:
            return
        loc = len(msg.tokens) + msg.loc
        key = _rid_key(msg.rid)
        n = 2 + _mix(key, loc, 1) % 3
        toks = [_mix(key, loc + i, 2) % self.vocab for i in range(n)]
        seen = list(msg.seen)
        seen[1] = loc + n
        back = PeerReq(msg.rid, src=1, dst=0, tokens=toks, loc=loc, prompt_len=msg.prompt_len, seen=seen,
                       num_hops=msg.num_hops)  # fmt: skip
        self.queue.append((self.clock + self.delay, back))

    def due(self) -> list[PeerReq]:
        self.clock += 1
        out = []
        while self.queue and self.queue[0][0] <= self.clock:
            out.append(self.queue.popleft()[1])
        return out


class LocalLoop(EngineLoop):
    """Messages for model 1 go to `peer`, finishes into `finished`; `run` returns when nothing is in flight, ready or
    at the peer. Test hooks: `between(batch)` after `schedule`, `complete_first` (k completes before k+1 launches)."""

    def __init__(self, engine: Any, sched: Scheduler, *, peer: EchoPeer | None = None,
                 between: Callable[[Batch], None] | None = None, complete_first: bool = False,
                 keep_handles: bool = False) -> None:  # fmt: skip
        super().__init__(engine, sched, keep_handles=keep_handles)
        self.peer, self.between, self.complete_first = peer, between, complete_first
        self.finished: dict[str, str] = {}

    def receive(self, timeout_s: float) -> None:
        msgs = self.peer.due() if self.peer is not None else []
        for msg in msgs:
            self.deliver(self.sched.resume(msg, time.monotonic()))
        if not msgs and timeout_s > 0:
            time.sleep(timeout_s)  # late prepare's wait (CUDA): nothing else can arrive meanwhile

    def wait_idle(self) -> None:
        if self.peer is not None and self.peer.queue:
            self.receive(0.0)
            return
        if self.sched.num_ready() == 0:
            self.stopping = True
            return
        deadline = self.sched.next_deadline()
        if deadline is None:
            raise RuntimeError("scheduler has ready requests but forms no batch with nothing in flight")
        time.sleep(max(0.0, deadline - time.monotonic()))

    def deliver(self, actions: list[Action], failed: frozenset[str] = frozenset()) -> None:
        for act in actions:
            if isinstance(act, Finish):
                self.finished[act.rid] = "error" if act.rid in failed else act.reason
            elif isinstance(act, Send) and self.peer is not None and isinstance(act.msg, PeerReq):
                self.peer.send(act.msg)

    def after_schedule(self, batch: Batch | None) -> None:
        if batch is not None and self.between is not None:
            self.between(batch)
        if self.complete_first and self.inflight:
            self.complete_oldest()
