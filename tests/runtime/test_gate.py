"""The sync coordinator (`runtime.gate`) in one process: its bookkeeping against `core.policy.SyncGate` driven by
hand, the wake pushes it sends, and what `RemoteGate` sends it (flushes of the ready count, releases).

References are computed here from `SyncGate`'s rules, never read back from the coordinator under test."""

from __future__ import annotations

import threading

import msgspec
import pytest

zmq = pytest.importorskip("zmq")

from tokenrouter.core.policy import PolicyKind, SyncGate  # noqa: E402
from tokenrouter.runtime.gate import Coordinator, GateCall, RemoteGate  # noqa: E402
from tokenrouter.runtime.protocol import GATE  # noqa: E402


@pytest.fixture
def wired(tmp_path):
    """A coordinator for two models whose wake pushes land on PULL sockets the test reads."""
    ctx = zmq.Context()
    subs = tuple(f"ipc://{tmp_path / f'sub{i}'}" for i in range(2))
    pulls = []
    for a in subs:
        s = ctx.socket(zmq.PULL)
        s.bind(a)
        pulls.append(s)
    coord = Coordinator(SyncGate(PolicyKind.STEP_SYNC, 2), f"ipc://{tmp_path / 'coord'}", subs)
    yield coord, pulls
    coord._stop.set()  # handle() is called directly: the serving thread never started
    for s in coord._wake:
        s.close()
    coord._sock.close()
    coord._ctx.term()
    for s in pulls:
        s.close()
    ctx.term()


def _wakes(sock, wait_ms: int = 300) -> int:
    n = 0
    while sock.poll(wait_ms if n == 0 else 50):
        chan, _ = sock.recv_multipart()
        assert chan == GATE
        n += 1
    return n


def test_release_undoes_only_the_releasing_models_launch(wired):
    """Step-sync, both models ready: 1 is granted, then 0; 1 completes; 0 formed no batch and releases. Only
    0's reservation goes: 1's completion stays applied, so the gate is quiet again and the next round forms.
    (Restoring the state as it was at 0's grant put 1 back into `running` for good: no launch ever again.)"""
    coord, _ = wired
    g = coord.gate
    coord.handle(GateCall(0, ready=1))  # 0 reports its ready count, so the round takes both
    assert coord.handle(GateCall(1, ready=1, ask="may"))
    assert coord.handle(GateCall(0, ready=1, ask="may"))
    assert (g.running, g.round) == ({0, 1}, set())
    coord.handle(GateCall(1, ready=1, ops=[("complete", 1)]))
    coord.handle(GateCall(0, ready=1, ask="release"))
    # 0 never launched: it is back in the round it was granted in; 1's step is over.
    assert g.running == set() and g.round == {0}
    assert coord.handle(GateCall(0, ready=1, ask="may"))
    coord.handle(GateCall(0, ready=1, ops=[("complete", 0)]))
    # the round is done and nothing runs: a new round takes every ready model
    assert coord.handle(GateCall(1, ready=1, ask="may"))
    assert coord.handle(GateCall(0, ready=1, ask="may"))


def test_release_without_a_grant_changes_nothing(wired):
    coord, pulls = wired
    g = coord.gate
    assert coord.handle(GateCall(0, ready=1, ask="may"))
    coord.handle(GateCall(0, ready=1, ops=[("complete", 0)]))
    before = (set(g.running), set(g.round), list(g.in_flight))
    _wakes(pulls[1])
    coord.handle(GateCall(0, ready=1, ask="release"))  # the grant was consumed by the launch
    assert (g.running, g.round, g.in_flight) == before
    assert _wakes(pulls[1], 200) == 0


def test_wakes_go_to_the_others_and_only_on_changes(wired):
    coord, pulls = wired
    # A send changes nobody's launch decision (the sender cannot launch before the arrival): no wake.
    coord.handle(GateCall(0, ready=0, ops=[("sent", 1)]))
    assert _wakes(pulls[0], 200) == 0 and _wakes(pulls[1], 200) == 0
    # An arrival may: wake every model but the caller.
    coord.handle(GateCall(1, ready=1, ops=[("arrived", 1)]))
    assert _wakes(pulls[0]) == 1 and _wakes(pulls[1], 200) == 0
    assert coord.handle(GateCall(1, ready=1, ask="may"))
    assert _wakes(pulls[0], 200) == 0  # a grant alone frees nothing for the others
    coord.handle(GateCall(1, ready=0, ops=[("complete", 1)]))
    assert _wakes(pulls[0]) == 1 and _wakes(pulls[1], 200) == 0


class _FakeCoordinator:
    """A ROUTER that records every `GateCall` and answers `may` with yes: what `RemoteGate` really sends."""

    def __init__(self, ctx, address: str) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(address)
        self.calls: list[GateCall] = []
        self._dec = msgspec.msgpack.Decoder(GateCall)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, payload = self.sock.recv_multipart()
            call = self._dec.decode(payload)
            self.calls.append(call)
            self.sock.send_multipart([ident, b"\x01" if call.ask == "may" else b"\x00"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def remote(tmp_path):
    ctx = zmq.Context()
    addr = f"ipc://{tmp_path / 'coord'}"
    fake = _FakeCoordinator(ctx, addr)
    gate = RemoteGate(0, addr, ctx, timeout_s=10)
    ready = {"n": 0}
    gate.attach(0, lambda: ready["n"])
    gate.attach(1, lambda: 99)  # another model's scheduler in this process: not ours, never reported
    yield gate, fake, ready
    gate.close()
    fake.close()
    ctx.term()


def test_flush_sends_ops_or_a_changed_ready_count_and_nothing_else(remote):
    gate, fake, ready = remote
    gate.flush()
    assert fake.calls == []  # nothing buffered, count unchanged (0)
    ready["n"] = 3
    gate.flush()  # no op, but the count changed: the coordinator must hear it
    assert [(c.ready, c.ops, c.ask) for c in fake.calls] == [(3, [], "")]
    gate.flush()
    assert len(fake.calls) == 1
    gate.note_sent(1)
    gate.on_complete(0)
    gate.flush()
    assert [(c.ready, c.ops) for c in fake.calls[1:]] == [(3, [("sent", 1), ("complete", 0)])]
    ready["n"] = 0  # e.g. a peer's finish emptied the queue without any gate op
    gate.flush()
    assert [(c.ready, c.ops) for c in fake.calls[2:]] == [(0, [])]


def test_release_is_sent_once_and_only_after_a_grant(remote):
    gate, fake, ready = remote
    ready["n"] = 1
    gate.release()
    assert fake.calls == []  # nothing granted: nothing to give back
    assert gate.may_launch(0)
    gate.release()
    gate.release()
    assert [c.ask for c in fake.calls] == ["may", "release"]
    assert gate.may_launch(0)
    gate.on_launch(0)  # the grant was used by a launch
    gate.release()
    assert [c.ask for c in fake.calls] == ["may", "release", "may"]
    with pytest.raises(RuntimeError):
        gate.on_launch(0)  # a launch needs a fresh grant
