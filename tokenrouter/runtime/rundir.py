"""The run directory of one server (`tokenrouter-*` in the temp folder; docs/runtime.md, "Supervision"). `owner.pid`
holds the owner's pid and start time; a directory without it, or whose owner runs, is never touched."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tokenrouter.runtime.mps import MpsDaemon

log = logging.getLogger(__name__)

PREFIX = "tokenrouter-"
OWNER_FILE = "owner.pid"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), None where unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know


def create_run_dir(parent: str | Path | None = None) -> Path:
    """A fresh run directory owned by this process (stale ones of dead owners are removed first)."""
    remove_stale(parent)
    d = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    pid = os.getpid()
    tmp = d / (OWNER_FILE + ".tmp")
    tmp.write_text(f"{pid} {_start_time(pid) or ''}\n")
    tmp.replace(d / OWNER_FILE)  # atomic: a sweeper sees no owner file or a whole one
    return d


def owner_of(d: Path) -> tuple[int, str | None] | None:
    try:
        parts = (d / OWNER_FILE).read_text().split()
        return int(parts[0]), (parts[1] if len(parts) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None


def owner_gone(d: Path) -> bool:
    """True only when `d` names an owner that no longer runs (or whose pid now belongs to a later process)."""
    owner = owner_of(d)
    if owner is None:
        return False
    pid, started = owner
    if not pid_alive(pid):
        return True
    now = _start_time(pid)
    return started is not None and now is not None and now != started


def remove(d: Path) -> None:
    """Remove a run directory, stopping an MPS daemon whose pipes live in it first."""
    if (d / "mps-pipe").is_dir():
        daemon = MpsDaemon(d)
        daemon.started = True
        try:
            daemon.stop()
        except (OSError, subprocess.SubprocessError) as e:  # no MPS tools here: nothing to stop
            log.debug("stale MPS daemon in %s: %s", d, e)
    shutil.rmtree(d, ignore_errors=True)


def remove_stale(parent: str | Path | None = None) -> list[Path]:
    """Remove every `tokenrouter-*` directory in `parent` (the temp folder) whose owner is gone."""
    root = Path(parent or tempfile.gettempdir())
    gone = []
    for d in root.glob(PREFIX + "*"):
        if d.is_dir() and not d.is_symlink() and owner_gone(d):
            remove(d)
            gone.append(d)
    if gone:
        log.info("removed %d run directories left by servers that are gone: %s", len(gone),
                 ", ".join(p.name for p in gone))  # fmt: skip
    return gone
