"""Progress of a long command that a redirected run (CI, a script) still shows: counted work as a rich bar on a
terminal and lines elsewhere (`progress_bar`), a search of unknown length as a status line or a line every few
seconds (`Heartbeat`). An error ends the display without leaving a bar behind, so a one-line error is one line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.status import Status
from rich.text import Text

HEARTBEAT_S = 10.0  # a redirected run prints its state at least this often


@contextmanager
def progress_bar(console: Console, *columns: ProgressColumn, every_s: float = HEARTBEAT_S) -> Iterator[Progress]:
    """A `Progress` with `columns`, used as usual. On a terminal it draws the bar; elsewhere a thread prints a line per
    task (its text columns) when it ends, and every `every_s` seconds the tasks still running."""
    terminal = console.is_terminal and not console.is_dumb_terminal
    bar = Progress(*columns, console=console, disable=not terminal)
    lines = None if terminal else ProgressLines(bar, console, every_s)
    with bar:
        if lines is not None:
            lines.start()
        try:
            yield bar
        except BaseException:
            bar.live.transient = True  # on a terminal the bar is erased; elsewhere it was never drawn
            if lines is not None:
                lines.stop(final=False)
            raise
        if lines is not None:
            lines.stop(final=True)


def counted(label: str) -> tuple[ProgressColumn, ...]:
    """The columns of counted work: `label` (a rich format string of the task), the bar, done/total, time."""
    return (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


class ProgressLines(threading.Thread):
    """Prints the progress of `bar`'s tasks as lines (module docstring)."""

    def __init__(self, bar: Progress, console: Console, every_s: float) -> None:
        super().__init__(name="progress-lines", daemon=True)
        self.bar, self.console, self.every_s = bar, console, every_s
        self.columns = bar.columns
        self.done = threading.Event()
        self.reported: set[int] = set()  # tasks whose end was printed
        self.last = time.monotonic()

    def run(self) -> None:
        while not self.done.wait(min(1.0, self.every_s)):
            self.tick()

    def tick(self, final: bool = False) -> None:
        """A line for each task that ended since the last tick; the running ones when `every_s` has passed."""
        tasks = list(self.bar.tasks)
        ended = [t for t in tasks if (t.finished or t.stop_time is not None) and t.id not in self.reported]
        running = [t for t in tasks if not (t.finished or t.stop_time is not None) and t.started]
        now = time.monotonic()
        due = final or now - self.last >= self.every_s
        for t in ended + (running if due else []):
            self.console.print(self.line(t), soft_wrap=True, highlight=False)
        self.reported.update(t.id for t in ended)
        if ended or due:
            self.last = now

    def line(self, task: Task) -> str:
        parts = []
        for col in self.columns:
            if isinstance(col, str):
                parts.append(col.format(task=task))
                continue
            shown = col.render(task)
            if isinstance(shown, Text):  # the bar is a renderable, not text: left out
                parts.append(shown.plain)
        return " ".join(p.strip() for p in parts if p.strip())

    def stop(self, final: bool) -> None:
        self.done.set()
        self.join(5)
        if final:
            self.tick(final=True)


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
