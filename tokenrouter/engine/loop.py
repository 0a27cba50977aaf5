"""`EngineLoop`: one subserver's schedule -> step -> complete loop over the core `Scheduler` and an `Engine`,
with or without overlap. The acceptance tests and `studies/engine/serving_loop.py` drive the engine through
it; the runtime's subserver loop does the same plus messaging.

Overlap (`overlap=True`, the scheduler built with `overlap=True`): step k+1 is launched before step k is
completed, so the host's complete(k) + schedule(k+2) + plan(k+2) run while the GPU runs step k+1; rows of
step k+1 that continue a row of step k are `from_prev` (their token never visits the host). The caller waits
on each step's own event (`StepHandle.result()`), never on the engine stream.

`complete_first=True` completes step k between scheduling and launching step k+1 (finishes and hand-offs of
step k then land between schedule and step of k+1: its rows for those requests are stale and skipped).
`between(batch)` is called after each schedule, before the step (tests abort requests there).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import Finish, PeerReq, Send
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.engine.handles import StepHandle
from tokenrouter.engine.runner import Engine


def _mix(*xs: int) -> int:
    h = 0x9E3779B9
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
    return h


def _rid_key(rid: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(rid))


class PositionHopRouter(Router):
    """A deterministic synthetic router: a sampled row hops to model 1 when a hash of (request, position) hits
    1 in `period`; the sampled token is dropped (the peer regenerates that position). Decisions depend only
    on the sequence, so overlap, batch composition and timing never change them."""

    name = "position-hop"

    def __init__(self, period: int = 5) -> None:
        super().__init__()
        self.period = period

    def route(self, batch: Batch, result: StepResult) -> list[int]:
        return [1 if row.sample and _mix(_rid_key(row.req.rid), row.start + row.num_tokens) % self.period == 0
                else self.model for row in batch.rows]  # fmt: skip


class EchoPeer:
    """Model 1 without a model: a request sent to it comes back `delay` loop iterations later with 2-4 tokens
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


@dataclass(slots=True)
class LoopStats:
    steps: int = 0
    handles: list[StepHandle] = field(default_factory=list)  # kept only with keep_handles
    schedule_s: float = 0.0
    step_s: float = 0.0  # host time inside Engine.step (plan + launch)
    complete_s: float = 0.0  # host time of complete (the wait on the step's event excluded)
    wait_s: float = 0.0  # host time blocked on step events
    finished: dict[str, str] = field(default_factory=dict)  # rid -> finish reason
    wall_s: float = 0.0


class EngineLoop:
    def __init__(self, engine: Engine, sched: Scheduler, *, overlap: bool, complete_first: bool = False,
                 between: Callable[[Batch], None] | None = None, keep_handles: bool = False,
                 peer: EchoPeer | None = None) -> None:  # fmt: skip
        if overlap != sched.overlap:
            raise ValueError("the scheduler's overlap setting must match the loop's")
        self.engine, self.sched = engine, sched
        self.overlap, self.complete_first = overlap, complete_first
        self.between = between
        self.keep_handles = keep_handles
        self.peer = peer
        self.stats = LoopStats()
        self._pending: deque[tuple[Batch, StepHandle]] = deque()

    def _complete_oldest(self) -> None:
        batch, handle = self._pending.popleft()
        t0 = time.perf_counter()
        handle.wait()
        t1 = time.perf_counter()
        for act in self.sched.complete(batch, handle.result(), 0.0):
            if isinstance(act, Finish):
                self.stats.finished[act.rid] = act.reason
            elif isinstance(act, Send) and self.peer is not None:
                self.peer.send(act.msg)
        t2 = time.perf_counter()
        self.stats.wait_s += t1 - t0
        self.stats.complete_s += t2 - t1

    def run(self, max_steps: int = 100_000) -> LoopStats:
        st = self.stats
        start = time.perf_counter()
        while st.steps < max_steps:
            if self.peer is not None:
                for msg in self.peer.due():
                    self.sched.resume(msg, 0.0)
            t0 = time.perf_counter()
            batch = self.sched.schedule(0.0)
            st.schedule_s += time.perf_counter() - t0
            if batch is not None and self.between is not None:
                self.between(batch)
            if self.complete_first and self._pending:
                self._complete_oldest()
            if batch is not None:
                t0 = time.perf_counter()
                handle = self.engine.step(batch)
                st.step_s += time.perf_counter() - t0
                st.steps += 1
                if self.keep_handles:
                    st.handles.append(handle)
                self._pending.append((batch, handle))
            while self._pending and (not self.overlap or batch is None or len(self._pending) > 1):
                self._complete_oldest()
            if batch is None and not self._pending:
                if self.peer is not None and self.peer.queue:
                    continue
                if self.sched.num_ready() == 0:
                    break
                raise RuntimeError("scheduler has ready requests but forms no batch with nothing in flight")
        while self._pending:
            self._complete_oldest()
        st.wall_s += time.perf_counter() - start
        return st
