"""Handles, shaped like a `multiprocessing.Process`, of subservers the launcher does not start (external, Ray). One
has exited after `Failed` (1), `Left` (0), a silence of `heartbeat_timeout_s` after `Ready` (1), or no join (1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.join import Join


class RemoteSubserver:
    def __init__(self, model: int, name: str, *, join_timeout_s: float, heartbeat_timeout_s: float,
                 how_to_start: str = "", clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.model, self.name, self.how_to_start, self.clock = model, name, how_to_start, clock
        self.join_timeout_s, self.heartbeat_timeout_s = join_timeout_s, heartbeat_timeout_s
        self.t0 = clock()
        self.joined: Join | None = None
        self.last_seen: float | None = None  # the latest Ready/Stats (None until Ready)
        self.exit_reason: str | None = None
        self._code: int | None = None
        self._gone = threading.Event()

    @property
    def pid(self) -> int | None:
        return None if self.joined is None else self.joined.pid

    @property
    def where(self) -> str:
        return "not joined" if self.joined is None else f"host {self.joined.hostname}, pid {self.joined.pid}"

    def on_join(self, join: Join) -> None:
        self.joined = join

    def on_control(self, msg: P.Ready | P.Stats | P.Failed) -> None:
        if isinstance(msg, P.Failed):
            self._exit(1, f"reported a failure ({self.where})")
        else:
            self.last_seen = self.clock()

    def on_left(self) -> None:
        self._exit(0, f"left ({self.where})")

    @property
    def exitcode(self) -> int | None:
        if self._code is None:
            self._check()
        return self._code

    def _check(self) -> None:
        now = self.clock()
        if self.joined is None and now - self.t0 > self.join_timeout_s:
            hint = f"; start it on its host with: {self.how_to_start}" if self.how_to_start else ""
            self._exit(1, f"did not join within {self.join_timeout_s:.0f} s{hint}")
        elif self.last_seen is not None and now - self.last_seen > self.heartbeat_timeout_s:
            self._exit(1, f"no heartbeat for {self.heartbeat_timeout_s:.0f} s ({self.where})")

    def _exit(self, code: int, reason: str) -> None:
        if self._code is None:
            self._code, self.exit_reason = code, reason
            self._gone.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it left (after the launcher's Shutdown). One that never joined has nothing to wait for."""
        if self.joined is None:
            return
        self._gone.wait(timeout)

    def kill(self) -> None:
        """Nothing to signal on another host: it exits by itself when its link to the launcher drops."""
        self._exit(1, f"did not confirm its shutdown ({self.where})")
