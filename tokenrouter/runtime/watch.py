"""Supervision of a running `Server` (`runtime.launcher`): the launcher socket, the watcher thread, exits, hangs,
restarts and giving up (docs/runtime.md, "Supervision")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

import zmq

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.cluster import Cluster
from tokenrouter.runtime.sockets import drain, push_socket, send_once
from tokenrouter.runtime.supervision import describe_exit, exit_reason

Listener = Callable[[P.Ready | P.Stats | P.Failed], None]
log = logging.getLogger("tokenrouter.runtime.launcher")  # the launcher's lines keep one logger name


class Supervisor:
    """The watching half of `launcher.Server` (a mixin: `Server` sets what is declared here and `_spawn`s)."""

    config: DeploymentConfig
    num_models: int
    addresses: Addresses
    cluster: Cluster | None
    restart_on_failure: bool
    heartbeat_timeout_s: float
    _ctx: zmq.Context
    _pull: zmq.Socket

    def _spawn(self, i: int, started: Callable[[Any], None]) -> None:
        raise NotImplementedError

    def _init_supervision(self) -> None:
        """What the watcher and `stop` track, empty until `start()`."""
        self._last_seen: dict[int, float] = {}  # model -> monotonic time of its latest Ready/Stats
        self.ready: dict[int, P.Ready] = {}
        self.stats: dict[int, P.Stats] = {}
        self.dead: dict[int, str] = {}
        self.processes: list[Any] = []
        self.aux: list[tuple[str, Any, str]] = []  # (name, process, address): never restarted; one exit fails all
        self._listeners: list[Listener] = []
        self._fatal_listeners: list[Callable[[str], None]] = []
        self.failure: str | None = None  # why the server gave up (a subserver died and is not restarted)
        self.restarts = [0] * self.num_models
        self._handled: dict[int, Any] = {}  # model -> the process object whose exit was dealt with
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watch_done = threading.Event()
        self._watcher: threading.Thread | None = None

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def add_fatal_listener(self, fn: Callable[[str], None]) -> None:
        """`fn(why)` once the server gives up (called from the watcher thread; at once if it already has)."""
        self._fatal_listeners.append(fn)
        if self.failure is not None:
            fn(self.failure)

    def serving(self) -> bool:
        """False once `stop()` began or the server gave up (`failure`)."""
        return not self._stopping.is_set() and self.failure is None

    def healthy(self) -> bool:
        return not self.dead and len(self.ready) == self.num_models

    def poll_control(self, timeout_ms: int) -> None:
        """Handle what arrived on the launcher's socket within `timeout_ms`: JOIN frames, Ready/Stats/Failed."""
        for chan, data in drain(self._pull, timeout_ms):
            if chan == P.JOIN:
                if self.cluster is not None:
                    self.addresses = self.cluster.on_join(data)
                continue
            msg = P.decode_for_frontend(data)
            if isinstance(msg, P.Ready | P.Stats):
                self._last_seen[msg.model] = time.monotonic()
            if isinstance(msg, P.Ready):
                if self.restarts[msg.model] and msg.model not in self.ready:
                    log.warning("model %d (%s) is serving again (restart %d, %.1f s to start)", msg.model,
                                msg.name, self.restarts[msg.model], msg.startup_s)  # fmt: skip
                self.ready[msg.model] = msg
            elif isinstance(msg, P.Stats):
                self.stats[msg.model] = msg
            elif isinstance(msg, P.Failed):
                self.dead.setdefault(msg.model, msg.message)
            else:
                continue
            for fn in self._listeners:
                fn(msg)

    def _watch(self) -> None:
        """Watcher thread: control messages, and the exit of any subserver (with or without a `Failed`)."""
        tell = push_socket(self._ctx, self.addresses.frontend, linger_ms=0)
        try:
            while not self._watch_done.is_set():
                self.poll_control(100)
                with self._lock:
                    if not self.serving():
                        continue
                    for i, p in enumerate(self.processes):
                        if p.exitcode is not None and self._handled.get(i) is not p:
                            self._handled[i] = p
                            self._on_exit(i, p, tell)
                    self._kill_hung()
                    for name, p, _ in self.aux:
                        if p.exitcode is not None and self.failure is None:
                            self._give_up(f"{name} died ({describe_exit(p.exitcode)})")
        finally:
            tell.close()

    def _kill_hung(self) -> None:
        """Kill a ready subserver of ours whose heartbeat stopped, so its exit takes the path of any death (remote
        ones have their own check, `runtime.remote`)."""
        now = time.monotonic()
        for i, p in enumerate(self.processes):
            seen = self._last_seen.get(i)
            if i not in self.ready or seen is None or p.exitcode is not None or not isinstance(p, BaseProcess):
                continue
            if now - seen > self.heartbeat_timeout_s:
                why = f"no heartbeat for {now - seen:.1f} s (hung)"
                log.error("subserver %d (%s) sent no heartbeat for %.1f s: killing it (pid %s)", i,
                          self.config.models[i].name, now - seen, p.pid)  # fmt: skip
                self.dead.setdefault(i, why)
                p.kill()

    def _on_exit(self, i: int, p: Any, tell: zmq.Socket) -> None:
        name = self.config.models[i].name
        said = self.dead.get(i)
        cause = exit_reason(p) + (f", after: {said}" if said else "")
        msg = f"subserver {i} ({name}) died ({cause})"
        was_ready = self.ready.pop(i, None) is not None
        self.dead[i] = msg
        log.error("%s; requests in flight fail", msg)
        failed = P.Failed(i, cause)  # the front-end names the subserver itself
        tell.send_multipart([P.CTL, P.encode(failed)])
        for fn in self._listeners:
            fn(failed)
        if self.restart_on_failure and was_ready:
            self._restart(i)
            return
        why = msg if was_ready or not self.restart_on_failure else f"{msg}, before it was ready again"
        self._give_up(why, "" if self.restart_on_failure else " (--restart-on-failure restarts it)")

    def _give_up(self, why: str, hint: str = "") -> None:
        self.failure = why
        log.error("giving up: %s%s", why, hint)
        for fn in self._fatal_listeners:
            fn(why)

    def _restart(self, i: int) -> None:
        """Survivors drop their requests and reconnect (before the new process binds); then subserver i restarts."""
        for j, addr in enumerate(self.addresses.subservers):
            if j != i:
                send_once(self._ctx, addr, [P.CTL, P.encode(P.Restarted(i))], linger_ms=1000)
        self.restarts[i] += 1
        log.warning("restarting subserver %d (%s), restart %d", i, self.config.models[i].name, self.restarts[i])

        def replace_dead(p: Any) -> None:
            self.processes[i] = p

        self._spawn(i, replace_dead)
        self.dead.pop(i, None)
