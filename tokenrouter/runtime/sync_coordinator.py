"""`step-sync` and `model-sync` across processes at one coordinator round trip per step (docs/baselines.md, section
1): a `Coordinator` holds the real `SyncGate`, each scheduler a `RemoteGate`; a grant carries how many gated
messages must have arrived (`bar`), counts cumulative, so a report need not precede its messages."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from tokenrouter.core.policy import SyncGate
from tokenrouter.runtime.protocol import GATE
from tokenrouter.runtime.sockets import push_socket

COMPLETE, PASS, UPDATE = "complete", "pass", "update"


class GateReport(msgspec.Struct, frozen=True, array_like=True):
    """Subserver -> coordinator: `what` is `complete` (step done), `pass` (a grant found nothing to run) or `update`
    (ready count changed off the step path); the counts (cumulative, `sent` per destination) read at one instant."""

    model: int
    what: str
    ready: int
    arrived: int
    sent: list[int]


_enc = msgspec.msgpack.Encoder()
_report_dec = msgspec.msgpack.Decoder(GateReport)
_bar_dec = msgspec.msgpack.Decoder(int)


@dataclass(slots=True)
class GateEvent:
    """A grant, a completion or a pass as the coordinator applied it (its own monotonic clock)."""

    time: float
    model: int
    what: str  # "launch" (a grant) | "complete" | "release" (a grant passed back unused)


@dataclass
class Coordinator:
    """Serves a `SyncGate` on a PULL socket in a daemon thread and pushes grants to the subservers. `log` records
    grants, completions and passes (tests, the ablation's timelines)."""

    gate: SyncGate
    address: str
    subservers: tuple[str, ...]
    log: list[GateEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        m = self.gate.num_models
        self._ready = [0] * m  # as last reported
        self._arrived = [0] * m  # as last reported by the receiver
        self._sent = [[0] * m for _ in range(m)]  # _sent[src][dst], as last reported by src
        for i in range(m):
            self.gate.attach(i, self._ready_of(i))
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._push = [push_socket(self._ctx, addr, linger_ms=0) for addr in self.subservers]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sync-coordinator", daemon=True)
        self.calls = 0  # messages received (reports, passes, updates): calibration divides by launched steps
        self.calls_by_model = [0] * m
        self.grants = 0  # grants pushed

    def inbound(self, model: int) -> int:
        """Gated messages sent to `model` so far, as the senders reported them."""
        return sum(row[model] for row in self._sent)

    def _ready_of(self, m: int) -> Callable[[], int]:
        # The last report plus what was sent to m since: ready by the time m launches (it waits for them, `bar`).
        return lambda: self._ready[m] + self.inbound(m) - self._arrived[m]

    def start(self) -> Coordinator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for s in self._push:
            s.close()
        self._sock.close()
        self._ctx.term()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(100):
                continue
            self.handle(_report_dec.decode(self._sock.recv()))

    def handle(self, report: GateReport) -> list[int]:
        """Apply one report to the gate and push a grant to every model the gate now lets launch; returns them."""
        self.calls += 1
        g, m = self.gate, report.model
        self.calls_by_model[m] += 1
        self._ready[m] = report.ready
        self._arrived[m] = report.arrived
        self._sent[m] = list(report.sent)
        if report.what == COMPLETE:
            g.on_complete(m)
            self.log.append(GateEvent(time.monotonic(), m, "complete"))
        elif report.what == PASS and m in g.running:
            g.on_complete(m)  # the grant ran nothing: it ends here like a step would (its slot or turn is used)
            self.log.append(GateEvent(time.monotonic(), m, "release"))
        return self._grant()

    def _grant(self) -> list[int]:
        g = self.gate
        out = []
        for m in range(g.num_models):
            if m not in g.running and g.may_launch(m):
                g.on_launch(m)  # a reservation: no other model is granted against it
                self.log.append(GateEvent(time.monotonic(), m, "launch"))
                self._push[m].send_multipart([GATE, _enc.encode(self.inbound(m))])
                self.grants += 1
                out.append(m)
        return out


class RemoteGate:
    """`SyncGate` for one subserver's scheduler; `may_launch` is local. The driver calls `flush()` after every
    scheduler call, `on_grant` for every GATE frame and `after_schedule` after every `schedule`."""

    def __init__(self, model: int, num_models: int, address: str, ctx: zmq.Context) -> None:
        self.model = model
        self._sock = push_socket(ctx, address, linger_ms=1000)
        self._ready: Callable[[], int] = lambda: 0
        self.sent = [0] * num_models  # gated messages sent, cumulative, per destination
        self.arrived = 0  # gated messages received, cumulative
        self.bar: int | None = None  # the held grant: launch once `arrived >= bar`
        self.running = False
        self._completed = False
        self._reported = (0, 0)  # (ready, arrived) of the last message the coordinator got from us

    def attach(self, model: int, ready: Callable[[], int]) -> None:
        # The builder builds every model's scheduler in every process, all with this gate: only ours counts.
        if model == self.model:
            self._ready = ready

    def note_sent(self, dst: int) -> None:
        self.sent[dst] += 1

    def note_arrived(self, dst: int) -> None:
        if dst == self.model:
            self.arrived += 1

    def on_complete(self, model: int) -> None:
        self.running = False
        self._completed = True

    def may_launch(self, model: int) -> bool:
        return self.bar is not None and self.arrived >= self.bar

    def on_launch(self, model: int) -> None:
        if not self.may_launch(model):
            raise RuntimeError("on_launch without a usable grant")
        self.bar = None
        self.running = True

    def on_grant(self, payload: bytes) -> None:
        if self.bar is not None or self.running:
            raise RuntimeError(f"model {self.model}: a second grant while one is held or a step runs")
        self.bar = _bar_dec.decode(payload)

    def flush(self) -> None:
        """The completion report if a step completed, else an update if the ready count changed for a reason the
        coordinator cannot know while we neither run nor hold a grant."""
        if self._completed:
            self._completed = False
            self._send(COMPLETE)
        elif not self.running and self.bar is None and self._unexplained():
            self._send(UPDATE)

    def after_schedule(self, formed: bool) -> None:
        """No batch formed: a grant whose messages all arrived but finds nothing ready is handed back (`pass`); one
        still waiting for messages or pages stays held (the model keeps its turn or slot)."""
        if not formed and self.may_launch(self.model) and self._ready() == 0:
            self.bar = None
            self._send(PASS)

    def _unexplained(self) -> bool:
        ready, arrived = self._reported
        expected = ready + self.arrived - arrived  # what the coordinator assumes once it knows the sends
        return (self._ready() > 0) != (expected > 0)

    def _send(self, what: str) -> None:
        self._reported = (self._ready(), self.arrived)
        self._sock.send(_enc.encode(GateReport(self.model, what, self._reported[0], self.arrived, self.sent)))

    def close(self) -> None:
        self._sock.close()


class CoordinatorProcess:
    """A `Coordinator` in a process of its own, off the front-end's GIL (docs/runtime.md). `log`, `calls`,
    `calls_by_model` and `grants` are asked of the process while it runs, and are its last values after `stop`."""

    def __init__(self, kind: str, num_models: int, address: str, subservers: tuple[str, ...],
                 ready_timeout_s: float = 60.0) -> None:  # fmt: skip
        import multiprocessing as mp

        from tokenrouter.runtime.spawn import start_spawned

        self._conn, child = mp.get_context("spawn").Pipe()
        self._final: tuple[list[GateEvent], int, list[int], int] | None = None
        self._proc = start_spawned(_serve_in_process, (str(kind), num_models, address, tuple(subservers), child),
                                   name="sync-coordinator", daemon=True)  # fmt: skip
        child.close()
        if not self._conn.poll(ready_timeout_s):
            self._proc.kill()
            raise RuntimeError(f"the sync coordinator did not start within {ready_timeout_s:g} s")
        self._conn.recv()  # bound and serving

    def _state(self) -> tuple[list[GateEvent], int, list[int], int]:
        if self._final is not None:
            return self._final
        self._conn.send("state")
        return self._conn.recv()

    @property
    def log(self) -> list[GateEvent]:
        return self._state()[0]

    @property
    def calls(self) -> int:
        return self._state()[1]

    @property
    def calls_by_model(self) -> list[int]:
        return self._state()[2]

    @property
    def grants(self) -> int:
        return self._state()[3]

    def stop(self) -> None:
        if self._final is None and self._proc.is_alive():
            try:
                self._conn.send("stop")
                if self._conn.poll(10):
                    self._final = self._conn.recv()
            except (OSError, EOFError):
                pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
        if self._final is None:
            self._final = ([], 0, [], 0)


def _serve_in_process(kind: str, num_models: int, address: str, subservers: tuple[str, ...], conn: Any) -> None:
    """The coordinator process: the `Coordinator` thread serves the gate; this thread answers the launcher."""
    coord = Coordinator(SyncGate(kind, num_models), address, subservers).start()
    conn.send("ready")
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the launcher is gone
                return
            if msg == "stop":
                coord.stop()
            conn.send((list(coord.log), coord.calls, list(coord.calls_by_model), coord.grants))
            if msg == "stop":
                return
    finally:
        if coord._thread.is_alive():
            coord.stop()
