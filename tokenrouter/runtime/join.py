"""Joining a tcp deployment (docs/cluster.md, "Joining and the published table"). Invariant: no process connects
to a subserver before the launcher published its endpoint (`Addresses.known`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses, bound_endpoint, split_tcp

log = logging.getLogger(__name__)

HEARTBEAT_IVL_MS = 1000  # ZeroMQ-level pings on the link to the launcher (a host that vanished sends no FIN)
HEARTBEAT_TIMEOUT_MS = 10_000


class Join(msgspec.Struct, tag="join", frozen=True):
    """Subserver -> launcher. `name` and `models` let the launcher refuse another config; `external`: started by
    hand, so `Welcome` must carry the deployment."""

    model: int
    name: str
    endpoint: str  # where its PULL listens (connect form)
    via: str  # the launcher's host as this subserver reached it
    pid: int
    hostname: str
    external: bool = False
    models: list[str] = []


class Welcome(msgspec.Struct, tag="welcome", frozen=True):
    """Launcher -> subserver: the address table as seen from its host, and what a `SubserverSpec` needs."""

    model: int
    frontend: str
    subservers: list[str]
    coordinator: str
    launcher: str
    submit: str = ""
    config_yaml: str = ""
    device: str = "cpu"
    memory_gb: float = 1.0
    seed: int = 0
    engine_overrides: dict[str, Any] = {}
    stats_interval_s: float = 0.5
    log_level: int = logging.WARNING

    @property
    def addresses(self) -> Addresses:
        return Addresses(self.frontend, tuple(self.subservers), self.coordinator, self.launcher, self.submit)


class Refused(msgspec.Struct, tag="refused", frozen=True):
    model: int
    message: str


class Left(msgspec.Struct, tag="left", frozen=True):
    """A joined subserver stopped (after Shutdown, or on its own)."""

    model: int


JoinMessage = Join | Welcome | Refused | Left
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(JoinMessage)


def encode(msg: JoinMessage) -> bytes:
    return _enc.encode(msg)


def decode(data: bytes) -> JoinMessage:
    return _dec.decode(data)


class JoinRefused(RuntimeError):
    """The launcher refused this subserver (the message says why)."""


class LauncherLink:
    """A PUSH socket to the launcher in a context of its own (so a watcher thread may own its monitor socket)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(address)

    def send(self, msg: JoinMessage) -> None:
        self.sock.send_multipart([P.JOIN, encode(msg)])

    def watch(self, on_lost: Callable[[], None]) -> None:
        """Call `on_lost()` (from a daemon thread) when the connection to the launcher drops after it was up."""
        from zmq.utils.monitor import recv_monitor_message

        mon = self._monitor

        def run() -> None:
            up = False
            while True:
                try:
                    ev = recv_monitor_message(mon)["event"]
                except zmq.ZMQError:
                    return  # the context is going away
                if ev == zmq.EVENT_CONNECTED:
                    up = True
                elif ev == zmq.EVENT_DISCONNECTED and up:
                    on_lost()
                    return

        threading.Thread(target=run, name="launcher-watch", daemon=True).start()

    def close(self) -> None:
        self.sock.close(linger=1000)
        # The monitor socket belongs to the watcher thread, if any: the process is about to exit, leave it.


@dataclass(slots=True)
class Joined:
    """A joined subserver's bound PULL (in `ctx`), its link to the launcher, and the launcher's answer."""

    ctx: zmq.Context
    pull: zmq.Socket
    link: LauncherLink
    welcome: Welcome


def join_launcher(addresses: Addresses, model: int, name: str, *, external: bool = False,
                  models: list[str] | None = None, timeout_s: float | None = None) -> Joined | None:  # fmt: skip
    """Bind model `model`'s PULL, join the launcher and wait for its answer: None when it is stopping (`Shutdown`),
    `JoinRefused` when it refused; TimeoutError after `timeout_s`."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    own = addresses.subservers[model]
    pull.bind(addresses.bind(own))
    endpoint = bound_endpoint(pull, own)
    link = LauncherLink(addresses.launcher)
    via = split_tcp(addresses.launcher)[0]
    link.send(Join(model, name, endpoint, via, os.getpid(), socket.gethostname(), external, list(models or [])))
    log.info("model %d (%s): listening on %s, joining the launcher at %s", model, name, endpoint, addresses.launcher)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            wait = 1000 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not pull.poll(wait):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no answer from the launcher at {addresses.launcher} within {timeout_s:.0f} s")
                continue
            chan, data = pull.recv_multipart()
            if chan == P.JOIN:
                msg = decode(data)
                if isinstance(msg, Refused):
                    raise JoinRefused(f"the launcher at {addresses.launcher} refused model {name}: {msg.message}")
                if isinstance(msg, Welcome):
                    return Joined(ctx, pull, link, msg)
            elif chan == P.CTL and isinstance(P.decode_for_subserver(data), P.Shutdown):
                log.info("model %d (%s): the launcher is stopping before it welcomed us", model, name)
                _close(ctx, pull, link)
                return None
    except BaseException:
        _close(ctx, pull, link)
        raise


def _close(ctx: zmq.Context, pull: zmq.Socket, link: LauncherLink) -> None:
    pull.close(linger=0)
    ctx.term()
    link.close()
