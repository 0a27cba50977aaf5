"""The synchronous baselines (`step-sync`, `model-sync`) across processes: one `Coordinator` (a thread in the
launcher) holds the real `core.policy.SyncGate`; each subserver's scheduler gets a `RemoteGate` with the same
interface, which talks to it over DEALER/ROUTER request-reply.

Why the calls are batched and when they are synchronous:
- In the simulator a `complete` (gate.on_complete, note_sent...) and the requeue that follows are one atomic
  step, and the gate reads every model's ready count live. Here the coordinator only knows the ready counts
  the subservers report, so `RemoteGate` buffers `on_complete`/`note_sent`/`note_arrived` and `flush()` sends
  them together with the caller's ready count *after* the scheduler call returned (requeue included). The
  subserver flushes before it delivers any `Send`, and the flush waits for the coordinator's reply, so a
  message's arrival (`note_arrived` on the peer) is never counted before its send.
- `may_launch` is a reservation: when the coordinator answers yes it applies `on_launch` at once (so no other
  model can be granted in between); the subserver calls `release()` if `schedule` then forms no batch.
- Any change that may let another model launch is followed by a wake (`protocol.GATE` frame) pushed to every
  other subserver, so an idle subserver blocked in its poll re-asks `schedule` (the driver duty of
  `Deployment.wakes`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq

from tokenrouter.core.policy import SyncGate
from tokenrouter.runtime.protocol import GATE


class GateCall(msgspec.Struct, frozen=True):
    """One request to the coordinator: buffered ops ("sent"/"arrived"/"complete", model) then `ask`."""

    model: int
    ready: int
    ops: list[tuple[str, int]] = []
    ask: str = ""  # "" (flush only) | "may" | "release" | "stop"


@dataclass(slots=True)
class GateEvent:
    """A launch or completion as the coordinator applied it (its own monotonic clock)."""

    time: float
    model: int
    what: str  # "launch" | "complete" | "release"


@dataclass
class Coordinator:
    """Serves a `SyncGate` on a ROUTER socket in a daemon thread. `log` records launches and completions
    (for tests and the ablation's timelines); it is appended only by the coordinator thread."""

    gate: SyncGate
    address: str
    subservers: tuple[str, ...]
    log: list[GateEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reported = [0] * self.gate.num_models
        for m in range(self.gate.num_models):
            self.gate.attach(m, self._ready_of(m))
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._wake = []
        for addr in self.subservers:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 0)
            s.connect(addr)
            self._wake.append(s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sync-coordinator", daemon=True)
        self._dec = msgspec.msgpack.Decoder(GateCall)
        self.calls = 0
        # model -> (it was running, it was in the round) just before its last grant: what `release` restores.
        self._snapshot: dict[int, tuple[bool, bool]] = {}

    def _ready_of(self, m: int) -> Callable[[], int]:
        return lambda: self._reported[m]

    def start(self) -> Coordinator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in self._wake:
            s.close()
        self._sock.close()
        self._ctx.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            ident, payload = self._sock.recv_multipart()
            answer = self.handle(self._dec.decode(payload))
            self._sock.send_multipart([ident, b"\x01" if answer else b"\x00"])

    def handle(self, call: GateCall) -> bool:
        """Apply one call to the gate; returns the answer to `may`. Wakes the others when state changed."""
        self.calls += 1  # one request-reply round trip of the calling subserver (calibration counts them)
        g, m = self.gate, call.model
        self._reported[m] = call.ready
        snapshot = self._snapshot.pop(m, None)  # a reservation lives until the model's next call
        changed = False
        for op, x in call.ops:
            if op == "sent":
                g.note_sent(x)
            elif op == "arrived":
                g.note_arrived(x)
                changed = True
            elif op == "complete":
                g.on_complete(x)
                self.log.append(GateEvent(time.monotonic(), x, "complete"))
                changed = True
        answer = False
        if call.ask == "may":
            answer = g.may_launch(m)
            if answer:
                self._snapshot[m] = (m in g.running, m in g.round)
                g.on_launch(m)
                self.log.append(GateEvent(time.monotonic(), m, "launch"))
        elif call.ask == "release" and snapshot is not None:
            # `schedule` formed no batch after a yes: undo this model's reservation, and only it. `on_launch`
            # touched nothing but m's membership of `running` and `round`; other models' launches and
            # completions applied since the grant must stay (restoring both sets whole undid them, and a
            # completed model left in `running` kept step-sync from ever being quiet again).
            was_running, was_in_round = snapshot
            (g.running.add if was_running else g.running.discard)(m)
            (g.round.add if was_in_round else g.round.discard)(m)
            self.log.append(GateEvent(time.monotonic(), m, "release"))
            changed = True
        if changed:
            for i, s in enumerate(self._wake):
                if i != m:
                    s.send_multipart([GATE, b""])
        return answer


class RemoteGate:
    """`SyncGate`'s interface for one subserver's scheduler, backed by the coordinator (see the module doc).

    Invariant: the driver calls `flush()` after every scheduler call that may have buffered ops, before it
    delivers that call's `Send` actions, and `release()` when `schedule` returned None.
    """

    def __init__(self, model: int, address: str, ctx: zmq.Context, timeout_s: float = 30.0) -> None:
        self.model = model
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self._timeout_ms = int(timeout_s * 1000)
        self._ops: list[tuple[str, int]] = []
        self._ready: Callable[[], int] = lambda: 0
        self._granted = False
        self._reported = 0  # the ready count the coordinator last heard from us
        self._enc = msgspec.msgpack.Encoder()

    def attach(self, model: int, ready: Callable[[], int]) -> None:
        # The builder builds every model's scheduler in every process, all with this gate: only ours counts.
        if model == self.model:
            self._ready = ready

    def note_sent(self, dst: int) -> None:
        self._ops.append(("sent", dst))

    def note_arrived(self, dst: int) -> None:
        self._ops.append(("arrived", dst))

    def on_complete(self, model: int) -> None:
        self._ops.append(("complete", model))

    def on_launch(self, model: int) -> None:
        if not self._granted:
            raise RuntimeError("on_launch without a granted may_launch")
        self._granted = False  # the coordinator applied it when it granted

    def may_launch(self, model: int) -> bool:
        self._granted = self._call("may")
        return self._granted

    def flush(self) -> None:
        """Send buffered ops, or just the ready count when it changed (a peer's finish or an abort empties the
        queue without any gate op; a stale count > 0 would keep model-sync's turn on an idle model forever)."""
        if self._ops or self._ready() != self._reported:
            self._call("")

    def release(self) -> None:
        if self._granted:
            self._granted = False
            self._call("release")

    def _call(self, ask: str) -> bool:
        ops, self._ops = self._ops, []
        self._reported = self._ready()
        self._sock.send(self._enc.encode(GateCall(self.model, self._reported, ops, ask)))
        if not self._sock.poll(self._timeout_ms):
            raise RuntimeError(f"sync coordinator did not answer within {self._timeout_ms} ms")
        return self._sock.recv() == b"\x01"

    def close(self) -> None:
        self._sock.close()
