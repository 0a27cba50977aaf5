"""Progress of long work as the commands show it: a live rich line on a terminal; on a pipe or a file, a plain line
at least every `every_s` seconds while the work runs (a redirected `trsim tune` must not look hung), and nothing
for work that ends sooner."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.status import Status


class Heartbeat:
    """Shows `status` (set by the work as it goes) while the `with` block runs. Start it after any process pool
    that forks (`sim.sim_pool`): a forked child would inherit this thread stopped."""

    def __init__(self, console: Console, every_s: float = 5.0) -> None:
        self.console = console
        self.every_s = every_s
        self.status = "starting"
        self._t0 = time.monotonic()
        self._live: Status | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, status: str) -> None:
        self.status = status
        if self._live is not None:
            self._live.update(status)

    def __enter__(self) -> Heartbeat:
        self._t0 = time.monotonic()
        if self.console.is_terminal:
            self._live = self.console.status(self.status)
            self._live.start()
        else:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.stop()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.console.print(f"[{time.monotonic() - self._t0:5.0f} s] {self.status}", highlight=False, soft_wrap=True)
