"""Run directories: a new server removes those whose owner process is gone, never one whose owner runs or
that has no owner file yet (a server between mkdtemp and writing it)."""

from __future__ import annotations

import os
import subprocess
import sys

from tokenrouter.runtime import rundir


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _dir(root, name: str, owner: str | None):
    d = root / f"{rundir.PREFIX}{name}"
    d.mkdir()
    (d / "sub0").write_text("")  # an ipc endpoint file, say
    if owner is not None:
        (d / rundir.OWNER_FILE).write_text(owner)
    return d


def test_only_directories_of_gone_owners_are_removed(tmp_path):
    me = os.getpid()
    started = rundir._start_time(me)
    dead = _dir(tmp_path, "dead", f"{_dead_pid()} 123\n")
    live = _dir(tmp_path, "live", f"{me} {started or ''}\n")
    no_owner = _dir(tmp_path, "starting", None)
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / rundir.OWNER_FILE).write_text(f"{_dead_pid()}\n")
    gone = rundir.remove_stale(tmp_path)
    assert gone == [dead] and not dead.exists()
    assert live.exists() and no_owner.exists() and other.exists()


def test_a_recycled_pid_is_not_the_owner(tmp_path):
    """Our pid in the owner file, with another start time: the process that wrote it is gone."""
    if rundir._start_time(os.getpid()) is None:
        return  # no /proc: the pid alone is all there is
    d = _dir(tmp_path, "recycled", f"{os.getpid()} 1\n")
    assert rundir.owner_gone(d)
    assert rundir.remove_stale(tmp_path) == [d]


def test_create_writes_the_owner_and_sweeps(tmp_path):
    stale = _dir(tmp_path, "old", f"{_dead_pid()}\n")
    d = rundir.create_run_dir(tmp_path)
    assert not stale.exists()
    assert d.name.startswith(rundir.PREFIX)
    assert rundir.owner_of(d) == (os.getpid(), rundir._start_time(os.getpid()))
    assert not rundir.owner_gone(d)
    assert rundir.remove_stale(tmp_path) == [] and d.exists()
