"""The sync coordinator (`runtime.sync_coordinator`) in one process: its grants against `core.policy.SyncGate`'s
rules worked out by hand, what `RemoteGate` sends (one report per completed step, updates only for unexplained
changes, passes), and a randomized check that the coordinator protocol launches exactly what the in-process
`SyncGate` launches.

References are derived here from `SyncGate`'s rules or by running `SyncGate` itself in process (what the simulator
runs), never read back from the coordinator under test."""

from __future__ import annotations

import heapq
import threading
from collections import deque

import msgspec
import pytest

zmq = pytest.importorskip("zmq")

from tokenrouter.core.policy import PolicyKind, SyncGate  # noqa: E402
from tokenrouter.runtime.protocol import GATE  # noqa: E402
from tokenrouter.runtime.sync_coordinator import (  # noqa: E402
    COMPLETE,
    PASS,
    UPDATE,
    Coordinator,
    CoordinatorProcess,
    GateReport,
    RemoteGate,
)


def _coordinator(tmp_path, kind: PolicyKind, m: int = 2):
    """A coordinator whose grant pushes land on PULL sockets the test reads (its thread is never started)."""
    ctx = zmq.Context()
    subs = tuple(f"ipc://{tmp_path / f'sub{i}'}" for i in range(m))
    pulls = []
    for a in subs:
        s = ctx.socket(zmq.PULL)
        s.bind(a)
        pulls.append(s)
    coord = Coordinator(SyncGate(kind, m), f"ipc://{tmp_path / 'coord'}", subs)
    return ctx, coord, pulls


def _running(tmp_path, kind: PolicyKind):
    ctx, coord, pulls = _coordinator(tmp_path, kind)
    yield coord, pulls
    coord.stop()
    for s in pulls:
        s.close()
    ctx.term()


@pytest.fixture
def step_sync(tmp_path):
    yield from _running(tmp_path, PolicyKind.STEP_SYNC)


@pytest.fixture
def model_sync(tmp_path):
    yield from _running(tmp_path, PolicyKind.MODEL_SYNC)


def _grants(sock, wait_ms: int = 300) -> list[int]:
    """The bars of every grant pushed to one subserver socket."""
    out = []
    while sock.poll(wait_ms if not out else 50):
        chan, data = sock.recv_multipart()
        assert chan == GATE
        out.append(msgspec.msgpack.decode(data))
    return out


def R(model: int, what: str, ready: int, arrived: int = 0, sent=(0, 0)) -> GateReport:
    return GateReport(model, what, ready, arrived, list(sent))


def test_step_sync_rounds_wait_for_every_member_and_grants_carry_the_messages_due(step_sync):
    coord, pulls = step_sync
    # A client request at an idle entry: the round is {0}; its grant waits for no message.
    assert coord.handle(R(0, UPDATE, 1)) == [0]
    assert _grants(pulls[0]) == [0]
    # Model 1 gets work while 0 runs: it joins the next round, not this one.
    assert coord.handle(R(1, UPDATE, 1)) == []
    # 0 completes having sent one hand-off to 1 (still in flight): nothing runs, so the next round is every model
    # with work: 1 (ready, plus the message due) and not 0 (nothing ready, nothing due). 1 must first receive 1.
    assert coord.handle(R(0, COMPLETE, 0, sent=(0, 1))) == [1]
    assert _grants(pulls[1]) == [1] and _grants(pulls[0], 100) == []
    # 1 completes (the message arrived before), sending one back: both have work; each grant counts its own due.
    assert sorted(coord.handle(R(1, COMPLETE, 1, arrived=1, sent=(1, 0)))) == [0, 1]
    assert _grants(pulls[0]) == [1] and _grants(pulls[1]) == [1]
    # The barrier: 0 completes first (a second hand-off to 1: counts are cumulative); nothing is granted until 1
    # has completed too. Then 1 has nothing ready but that message due, so it is in the round, waiting for it.
    assert coord.handle(R(0, COMPLETE, 1, arrived=1, sent=(0, 2))) == []
    assert sorted(coord.handle(R(1, COMPLETE, 0, arrived=1, sent=(1, 0)))) == [0, 1]
    assert _grants(pulls[0]) == [1] and _grants(pulls[1]) == [2]
    assert [e.what for e in coord.log].count("launch") == 6


def test_model_sync_takes_turns_and_folds_messages_in_flight_into_the_turn(model_sync):
    coord, pulls = model_sync
    assert coord.handle(R(0, UPDATE, 2)) == [0]
    assert coord.handle(R(1, UPDATE, 1)) == []  # 0 runs: one model at a time
    # 0 completes: the turn moves to 1, which has work; 0 still has work but waits its turn.
    assert coord.handle(R(0, COMPLETE, 2, sent=(0, 1))) == [1]
    assert _grants(pulls[1]) == [1]
    # 1 completes with nothing left and no message due: the turn goes back to 0.
    assert coord.handle(R(1, COMPLETE, 0, arrived=1)) == [0]
    # 0 completes, its only work sent to 1: 1's turn, though 1's report says 0 ready (the message is due there).
    assert coord.handle(R(0, COMPLETE, 0, sent=(0, 2))) == [1]
    assert _grants(pulls[1]) == [2]
    assert [e.model for e in coord.log if e.what == "launch"] == [0, 1, 0, 1]


def test_a_pass_ends_the_slot_and_frees_the_round(step_sync):
    coord, _ = step_sync
    coord.handle(R(1, UPDATE, 1))
    assert coord.handle(R(0, UPDATE, 1)) == []  # the round {1} formed at 1's update
    assert coord.handle(R(1, COMPLETE, 1)) == [0, 1]
    # 1's work went away (an abort) before it launched: its pass must not hold the barrier.
    assert coord.handle(R(1, PASS, 0)) == []
    assert coord.log[-1].what == "release" and coord.gate.running == {0}
    assert coord.handle(R(0, COMPLETE, 1)) == [0]
    # A pass without a held grant (a late one) changes nothing.
    before = (set(coord.gate.running), set(coord.gate.round))
    coord.handle(R(1, PASS, 0))
    assert (coord.gate.running, coord.gate.round) == before


def test_grants_go_only_to_the_models_they_let_launch(step_sync):
    coord, pulls = step_sync
    coord.handle(R(0, UPDATE, 1))
    coord.handle(R(0, COMPLETE, 1))
    coord.handle(R(0, COMPLETE, 1))
    assert _grants(pulls[0]) == [0, 0, 0]
    assert _grants(pulls[1], 200) == []  # model 1 had nothing: never woken
    assert coord.calls == 3 and coord.calls_by_model == [3, 0] and coord.grants == 3


# ---- RemoteGate --------------------------------------------------------------------------------------------------
class _Recorder:
    """A PULL at the coordinator's address that records every report `RemoteGate` sends."""

    def __init__(self, ctx, address: str) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.bind(address)
        self.dec = msgspec.msgpack.Decoder(GateReport)

    def take(self, wait_ms: int = 300) -> list[GateReport]:
        out = []
        while self.sock.poll(wait_ms if not out else 50):
            out.append(self.dec.decode(self.sock.recv()))
        return out


@pytest.fixture
def remote(tmp_path):
    ctx = zmq.Context()
    addr = f"ipc://{tmp_path / 'coord'}"
    rec = _Recorder(ctx, addr)
    gate = RemoteGate(0, 2, addr, ctx)
    ready = {"n": 0}
    gate.attach(0, lambda: ready["n"])
    gate.attach(1, lambda: 99)  # another model's scheduler in this process: not ours, never reported
    yield gate, rec, ready
    gate.close()
    rec.sock.close()
    ctx.term()


def _bar(n: int) -> bytes:
    return msgspec.msgpack.encode(n)


def test_one_report_per_completed_step_and_nothing_on_the_launch_path(remote):
    gate, rec, ready = remote
    ready["n"] = 2
    gate.flush()  # a client request at an idle entry: the one update
    assert [(r.what, r.ready) for r in rec.take()] == [(UPDATE, 2)]
    gate.on_grant(_bar(0))
    assert gate.may_launch(0)  # local: no message
    gate.on_launch(0)
    gate.note_sent(1)
    gate.note_sent(1)
    ready["n"] = 1
    gate.flush()  # mid-step (e.g. after a resume): nothing, the completion report will carry it
    gate.on_complete(0)
    gate.flush()
    gate.flush()  # one report per completion, however many flushes follow
    got = rec.take()
    assert [(r.what, r.ready, r.arrived, r.sent) for r in got] == [(COMPLETE, 1, 0, [0, 2])]
    assert not gate.may_launch(0)  # no grant yet: the coordinator's answer is the next grant
    with pytest.raises(RuntimeError):
        gate.on_launch(0)


def test_a_grant_waits_for_the_messages_it_counts(remote):
    gate, rec, ready = remote
    gate.on_grant(_bar(2))
    gate.note_arrived(0)
    ready["n"] = 1
    assert not gate.may_launch(0)
    gate.flush()  # an arrival is explained (the coordinator counted the send): no update
    gate.after_schedule(False)  # formed nothing because a message is still due: the grant is kept
    assert rec.take(200) == []
    gate.note_arrived(1)  # another model's arrival in this process: not ours
    assert not gate.may_launch(0)
    gate.note_arrived(0)
    assert gate.may_launch(0)


def test_updates_only_for_changes_the_coordinator_cannot_know(remote):
    gate, rec, ready = remote
    ready["n"] = 1
    gate.flush()
    assert [r.what for r in rec.take()] == [UPDATE]
    ready["n"] = 3
    gate.flush()  # still > 0: the coordinator's decision cannot change
    assert rec.take(200) == []
    ready["n"] = 0  # an abort emptied the queue
    gate.flush()
    assert [(r.what, r.ready) for r in rec.take()] == [(UPDATE, 0)]
    # A hand-off arrives for a request that had ended here: counted as arrived, but nothing became ready.
    gate.note_arrived(0)
    gate.flush()
    assert [(r.what, r.ready, r.arrived) for r in rec.take()] == [(UPDATE, 0, 1)]
    # A hand-off arrives and its request is ready: explained by the sender's report, no update.
    gate.note_arrived(0)
    ready["n"] = 1
    gate.flush()
    assert rec.take(200) == []


def test_a_grant_that_finds_nothing_is_passed_back_once(remote):
    gate, rec, ready = remote
    gate.on_grant(_bar(0))
    ready["n"] = 1
    gate.after_schedule(False)  # ready but not formed (pool short): keep the grant
    assert rec.take(200) == [] and gate.may_launch(0)
    ready["n"] = 0
    gate.after_schedule(False)
    gate.after_schedule(False)
    assert [r.what for r in rec.take()] == [PASS]
    assert not gate.may_launch(0)
    gate.on_grant(_bar(0))
    with pytest.raises(RuntimeError):
        gate.on_grant(_bar(0))  # the coordinator never grants a model twice


# ---- the coordinator protocol launches what SyncGate launches -----------------------------------------------------
def _h(*xs: int) -> int:
    v = 0x9E3779B9
    for x in xs:
        v = (v * 1_000_003 ^ (x + 0x7F4A7C15)) & 0xFFFFFFFF
    return v


class _Toy:
    """A closed toy deployment: M models, each step takes every ready request of its model and lasts `dur[m]`;
    after each visit a request stays or hops (a hash of its id and visit), a hop lands after a delay (same hash),
    and a request ends after `visits`. Every decision is a function of the event, so two drivers that launch the
    same steps see the same events. `gate_for(m)` gives the object with SyncGate's interface for model m."""

    def __init__(self, m: int, seed: int, n_req: int, visits: int) -> None:
        self.m, self.seed, self.visits = m, seed, visits
        self.dur = [1 + _h(seed, k) % 4 for k in range(m)]
        self.ready = [deque() for _ in range(m)]
        self.ready[0].extend(range(n_req))
        self.seen = dict.fromkeys(range(n_req), 0)
        self.running: list[list[int] | None] = [None] * m
        self.events: list[tuple[int, int, str, int, int]] = []
        self.seq = 0
        self.launches: list[tuple[int, int, tuple[int, ...]]] = []

    def push(self, t: int, what: str, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, a, b))

    def run(self, gate_for, flush, after_schedule, pending_grants) -> list[tuple[int, int, tuple[int, ...]]]:
        t = 0
        for k in range(self.m):
            flush(k, t)
        self.launch_all(t, gate_for, after_schedule, pending_grants)
        while self.events:
            t, _, what, a, b = heapq.heappop(self.events)
            if what == "done":
                self.done(t, a, gate_for(a))
                flush(a, t)
            else:
                gate_for(a).note_arrived(a)
                self.ready[a].append(b)
                flush(a, t)
            self.launch_all(t, gate_for, after_schedule, pending_grants)
        assert all(not q for q in self.ready) and not any(self.running)
        return self.launches

    def launch_all(self, t, gate_for, after_schedule, pending_grants) -> None:
        again = True
        while again:  # grants delivered at this instant may let more models launch
            pending_grants()
            again = False
            for k in range(self.m):
                formed = False
                if self.running[k] is None and self.ready[k] and gate_for(k).may_launch(k):  # Scheduler.schedule
                    gate_for(k).on_launch(k)
                    batch = sorted(self.ready[k])
                    self.ready[k].clear()
                    self.running[k] = batch
                    self.launches.append((t, k, tuple(batch)))
                    self.push(t + self.dur[k], "done", k)
                    formed = True
                again |= after_schedule(k, formed)

    def done(self, t: int, k: int, gate) -> None:
        gate.on_complete(k)
        batch, self.running[k] = self.running[k], None
        for rid in batch:
            self.seen[rid] += 1
            v = self.seen[rid]
            if v == self.visits:
                continue
            dst = _h(self.seed, rid, v) % self.m
            if dst == k:
                self.ready[k].append(rid)
            else:
                gate.note_sent(dst)
                self.push(t + 1 + _h(self.seed, rid, v, 7) % 5, "arrive", dst, rid)


def _reference(kind, m, seed, n_req, visits):
    toy = _Toy(m, seed, n_req, visits)
    gate = SyncGate(kind, m)
    for k in range(m):
        gate.attach(k, lambda k=k: len(toy.ready[k]))
    return toy.run(lambda k: gate, lambda k, t: None, lambda k, formed: False, lambda: None)


class _NoSocket:
    def __init__(self, fn) -> None:
        self.fn = fn

    def send(self, data: bytes) -> None:
        self.fn(data)

    def send_multipart(self, frames) -> None:
        self.fn(frames)

    def close(self) -> None:
        pass


def _through_coordinator(tmp_path, kind, m, seed, n_req, visits):
    tmp_path.mkdir(parents=True, exist_ok=True)
    """The same toy, each model's gate a `RemoteGate` whose reports reach `Coordinator.handle` at once and whose
    grants are delivered at the same instant (zero-latency sockets: only the protocol differs)."""
    toy = _Toy(m, seed, n_req, visits)
    ctx = zmq.Context()
    subs = tuple(f"ipc://{tmp_path / f's{k}'}" for k in range(m))
    coord = Coordinator(SyncGate(kind, m), f"ipc://{tmp_path / 'c'}", subs)
    inbox: deque[tuple[int, bytes]] = deque()
    reports: deque[bytes] = deque()
    real = coord._push
    coord._push = [_NoSocket(lambda frames, k=k: inbox.append((k, frames[1]))) for k in range(m)]
    dec = msgspec.msgpack.Decoder(GateReport)
    gates = []
    for k in range(m):
        g = RemoteGate(k, m, f"ipc://{tmp_path / 'c'}", ctx)
        g._sock.close()
        g._sock = _NoSocket(reports.append)
        g.attach(k, lambda k=k: len(toy.ready[k]))
        gates.append(g)

    def deliver() -> None:
        while reports:
            coord.handle(dec.decode(reports.popleft()))

    def flush(k, t) -> None:
        gates[k].flush()
        deliver()

    def after_schedule(k, formed) -> bool:
        gates[k].after_schedule(formed)
        deliver()
        return bool(inbox)

    def pending_grants() -> None:
        while inbox:
            k, bar = inbox.popleft()
            gates[k].on_grant(bar)

    try:
        launches = toy.run(lambda k: gates[k], flush, after_schedule, pending_grants)
    finally:
        coord._push = real
        coord.stop()
        ctx.term()
    steps = len(launches)
    return launches, coord.calls, coord.grants, steps


@pytest.mark.parametrize("kind", [PolicyKind.STEP_SYNC, PolicyKind.MODEL_SYNC])
@pytest.mark.parametrize("m", [2, 3])
def test_the_coordinator_launches_exactly_what_the_core_gate_launches(tmp_path, kind, m):
    for seed in range(12):
        want = _reference(kind, m, seed, n_req=5, visits=6)
        got, calls, grants, steps = _through_coordinator(tmp_path / f"{seed}", kind, m, seed, n_req=5, visits=6)
        assert got == want, (seed, kind)
        # One report per launched step, plus the entry's one update when the clients' requests arrive; every
        # grant launched a step (nothing is aborted in the toy, so nothing is passed back).
        assert calls == steps + 1 and grants == steps, (seed, calls, grants, steps)


def test_the_coordinator_thread_serves_reports_and_stops(tmp_path):
    ctx, coord, pulls = _coordinator(tmp_path, PolicyKind.STEP_SYNC)
    coord.start()
    gate = RemoteGate(0, 2, f"ipc://{tmp_path / 'coord'}", ctx)
    gate.attach(0, lambda: 1)
    try:
        gate.flush()
        assert _grants(pulls[0], 5000) == [0]
        done = threading.Event()
        threading.Thread(target=lambda: (coord.stop(), done.set()), daemon=True).start()
        assert done.wait(10)
    finally:
        gate.close()
        for s in pulls:
            s.close()
        ctx.term()


def test_the_coordinator_process_serves_and_keeps_its_counts_after_stop(tmp_path):
    """The launcher's coordinator runs in a process of its own (no GIL shared with the front-end): the same grants,
    its log and counts read from the launcher while it runs and after it stopped."""
    ctx = zmq.Context()
    subs = tuple(f"ipc://{tmp_path / f'sub{i}'}" for i in range(2))
    pulls = []
    for a in subs:
        s = ctx.socket(zmq.PULL)
        s.bind(a)
        pulls.append(s)
    coord = CoordinatorProcess("step-sync", 2, f"ipc://{tmp_path / 'coord'}", subs)
    gate = RemoteGate(0, 2, f"ipc://{tmp_path / 'coord'}", ctx)
    gate.attach(0, lambda: 1)
    try:
        gate.flush()  # model 0 has work it never reported: an update, answered by a grant
        assert _grants(pulls[0], 5000) == [0]
        assert coord.calls == 1 and coord.calls_by_model == [1, 0] and coord.grants == 1
        assert [(e.model, e.what) for e in coord.log] == [(0, "launch")]
        coord.stop()
        assert not coord._proc.is_alive()
        assert coord.calls == 1 and coord.grants == 1 and [e.what for e in coord.log] == ["launch"]
    finally:
        coord.stop()
        gate.close()
        for s in pulls:
            s.close()
        ctx.term()
