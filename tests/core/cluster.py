"""A realistic cluster driver for core tests: what the multi-process runtime does to the schedulers.

- every message goes through the wire encoding (msgpack via msgspec) and arrives after a seeded random
  delay; order is kept per link (src, dst) and lost across links;
- steps take seeded random time; with overlap two batches are in flight per model, executed in launch order
  by a `FakeExecutor` whose token depends on what was fed (a `from_prev` row's token included);
- after every event the invariants below are checked, and at the end every request's output is checked
  against the token reference, position by position.

Invariants: KV pages conserved and never shared; each request's pages cover its computed tokens; every
output position emitted exactly once; a message shares no mutable object with its sender and arrives as
it was sent; model-sync never runs two models at once; step-sync's barrier holds; parked requests are
evicted before waiting ones, and only for older requests; at the end, every subserver's live count equals
the entry's, which is 0.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from fakes import FakeExecutor, check_output

from tokenrouter.core import wire
from tokenrouter.core.admission import Admission, PoolSize
from tokenrouter.core.batch import Batch
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Action, Emit, Finish, PeerReq, Send
from tokenrouter.core.policy import Policy, PolicyKind, SyncGate
from tokenrouter.core.request import ReqStatus, Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler


@dataclass(order=True, slots=True)
class _Event:
    time: float
    order: int
    kind: str = field(compare=False)
    data: object = field(compare=False)


class LiveCluster:
    def __init__(
        self,
        router: Callable[[], Router],
        *,
        num_models: int = 3,
        seed: int = 0,
        pages: int = 64,
        page_size: int = 4,
        policy: Policy | None = None,
        overlap: bool = False,
        admission: bool = False,
        max_delay: float = 3.0,
        step_time: tuple[float, float] = (1.0, 3.0),
        drop_live_counts: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        policy = policy or Policy()
        self.gate = SyncGate(policy.kind, num_models) if policy.is_sync else None
        self.policy = policy
        pools = [KVPool(pages, page_size) for _ in range(num_models)]
        adm = Admission([PoolSize(p.num_pages - 1, p.page_size) for p in pools]) if admission else None
        self.scheds = [
            Scheduler(
                m,
                num_models,
                kv=pools[m],
                router=router(),
                policy=policy,
                gate=self.gate,
                overlap=overlap,
                admission=adm if m == 0 else None,
            )
            for m in range(num_models)
        ]
        self.executors = [FakeExecutor(m) for m in range(num_models)]
        self.max_delay, self.step_time, self.drop_live_counts = max_delay, step_time, drop_live_counts
        self.now = 0.0
        self._events: list[_Event] = []
        self._order = itertools.count()
        self._link_last: dict[tuple[int, int], float] = {}
        self.running: list[list[tuple[Batch, float, float, object]]] = [[] for _ in range(num_models)]
        self.last_complete = [-1.0] * num_models
        self.prompts: dict[str, list[int]] = {}
        self.emitted: dict[str, dict[int, tuple[int, int]]] = {}
        self.finished: dict[str, str] = {}
        self.num_launches = 0

    # ---- driving ------------------------------------------------------------------------------------
    def submit(self, rid: str, prompt: list[int], max_tokens: int, at: float = 0.0) -> None:
        self.prompts[rid] = list(prompt)
        self._push(at, "arrive", (rid, max_tokens))

    def run(self, max_events: int = 200_000) -> None:
        for _ in range(max_events):
            if not self._events:
                break
            ev = heapq.heappop(self._events)
            self.now = ev.time
            getattr(self, f"_on_{ev.kind}")(ev.data)
            self.check()
        else:
            raise AssertionError("cluster did not go idle")
        self.check_end()

    def _push(self, at: float, kind: str, data: object) -> None:
        heapq.heappush(self._events, _Event(at, next(self._order), kind, data))

    def _on_arrive(self, data) -> None:
        rid, max_tokens = data
        n = len(self.scheds)
        req = Request(rid, list(self.prompts[rid]), len(self.prompts[rid]), SamplingParams(max_tokens=max_tokens,
                      ignore_eos=True), num_models=n)  # fmt: skip
        self.dispatch(0, self.scheds[0].add(req, self.now))

    def _on_deliver(self, data) -> None:
        dst, frame, sent = data
        msg = wire.decode(frame)
        assert wire.encode(sent) == frame, "a message changed after it was sent (shared with its sender?)"
        self.dispatch(dst, self.scheds[dst].resume(msg, self.now))

    def _on_complete(self, model: int) -> None:
        batch, _, _, result = self.running[model].pop(0)
        self.last_complete[model] = self.now
        self.dispatch(model, self.scheds[model].complete(batch, result, self.now))

    def dispatch(self, src: int, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._send(src, a)
            elif isinstance(a, Emit):
                got = self.emitted.setdefault(a.rid, {})
                for i, t in enumerate(a.tokens):
                    assert a.pos + i not in got, f"{a.rid}: output position {a.pos + i} emitted twice"
                    got[a.pos + i] = (t, a.model)
            elif isinstance(a, Finish):
                assert a.rid not in self.finished, f"{a.rid} finished twice"
                self.finished[a.rid] = a.reason
        wake = range(len(self.scheds)) if self.gate is not None else (src,)
        for m in wake:
            self._launch(m)

    def _send(self, src: int, a: Send) -> None:
        msg = a.msg
        if isinstance(msg, PeerReq):
            req = self.scheds[src].reqs.get(msg.rid)
            if req is not None:
                assert msg.seen is not req.seen and msg.tokens is not req.token_ids, "message shares sender state"
        elif self.drop_live_counts:
            return
        link = (src, a.peer)
        at = max(self.now + self.rng.uniform(0.0, self.max_delay), self._link_last.get(link, 0.0) + 1e-6)
        self._link_last[link] = at
        self._push(at, "deliver", (a.peer, wire.encode(msg), msg))

    def _launch(self, m: int) -> None:
        s = self.scheds[m]
        overlap = s.overlap and self.gate is None
        while not self.running[m] or (overlap and len(self.running[m]) < 2):
            before = {r.rid: (r.status, bool(r.pages), r.seq) for r in s.reqs.values()}
            batch = s.schedule(self.now)
            if batch is None:
                return
            self._check_evictions(s, before, batch)
            self._check_sync(m)
            start = max([self.now] + [e for _, _, e, _ in self.running[m]])
            end = start + self.rng.uniform(*self.step_time)
            self.running[m].append((batch, start, end, self.executors[m].run(batch)))
            self._push(end, "complete", m)
            self.num_launches += 1

    # ---- invariants ---------------------------------------------------------------------------------
    def check(self) -> None:
        for s in self.scheds:
            owned = [p for r in s.reqs.values() for p in r.pages]
            assert len(owned) == len(set(owned)) and 0 not in owned, f"model {s.model}: a page has two owners"
            assert s.kv.num_free + len(owned) == s.kv.num_pages - 1, f"model {s.model}: KV pages leaked"
            for r in s.reqs.values():
                assert len(r.pages) * s.kv.page_size >= r.num_computed, f"{r.rid}: pages do not cover its KV"

    def _check_evictions(self, s: Scheduler, before: dict, batch: Batch) -> None:
        """A request may lose its pages only to an older one, parked requests before queued ones: when a waiting
        request w was evicted, every parked request younger than the youngest batch row older than w (so younger
        than whichever row took w's pages) must have been evicted first."""
        lost = [rid for rid, (_, had, _) in before.items() if had and rid in s.reqs and not s.reqs[rid].pages]
        for rid in lost:
            status, _, seq = before[rid]
            older = [r.req.seq for r in batch.rows if r.req.seq < seq]
            if status != ReqStatus.WAITING or not older:
                continue
            kept = [
                r.rid
                for r in s.reqs.values()
                if r.status == ReqStatus.PENDING and r.pages and r.seq > max(older) and before[r.rid][0] == r.status
            ]
            assert not kept, f"waiting {rid} evicted while parked {kept} (younger than its taker) kept pages"

    def _check_sync(self, m: int) -> None:
        others = [(j, run[0][1]) for j, run in enumerate(self.running) if j != m and run]
        if self.policy.kind is PolicyKind.MODEL_SYNC:
            assert not others, f"model-sync: model {m} launched while {[j for j, _ in others]} run"
        if self.policy.kind is PolicyKind.STEP_SYNC:
            for j, started in others:
                assert self.last_complete[m] <= started, f"step-sync: model {m} ran twice while model {j} ran once"

    def check_end(self) -> None:
        entry = self.scheds[0]
        assert not entry.admit_queue, "requests left waiting at admission"
        assert set(self.finished) == set(self.prompts), f"unfinished: {set(self.prompts) - set(self.finished)}"
        for s in self.scheds:
            assert (s.active, s.epoch) == (entry.active, entry.epoch), "live counts did not converge"
            assert not s.reqs and not s.waiting and s.kv.num_free == s.kv.num_pages - 1
        assert entry.active == 0
        for rid, got in self.emitted.items():
            check_output(self.prompts[rid], [(p, t, m) for p, (t, m) in got.items()])
