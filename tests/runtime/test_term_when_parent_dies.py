"""`term_when_parent_dies`: what a test or a study starts (a whole `tr serve`) is told to stop when the process
that started it ends, even by SIGKILL, which runs no cleanup of its own. Reference: the child's own record of
the signal it received, not anything the helper reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

# The child records the signal that reached it; the parent starts the child and then waits to be killed.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def on_term(signum, frame):
    out.write_text(f"signal {signum}")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
out.write_text("ready")
time.sleep(60)
"""
PARENT = """
import subprocess, sys, time
from tokenrouter.runtime.parent_watch import term_when_parent_dies
preexec = term_when_parent_dies if sys.argv[3] == "1" else None
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True,
                         preexec_fn=preexec)
print(child.pid, flush=True)
time.sleep(60)
"""


def _wait_for(path: Path, text: str, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().startswith(text):
            return True
        time.sleep(0.05)
    return False


def _kill_parent(tmp_path: Path, with_preexec: bool) -> tuple[Path, int]:
    out = tmp_path / f"child-{int(with_preexec)}.txt"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(out), "1" if with_preexec else "0"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    child_pid = int(parent.stdout.readline())
    assert _wait_for(out, "ready"), "the child never started"
    parent.send_signal(signal.SIGKILL)  # no handler, no atexit: only the kernel can tell the child
    parent.wait()
    return out, child_pid


def test_the_child_gets_sigterm_when_its_parent_is_killed(tmp_path):
    out, _ = _kill_parent(tmp_path, with_preexec=True)
    assert _wait_for(out, "signal"), out.read_text()
    assert out.read_text() == f"signal {int(signal.SIGTERM)}"


def test_without_it_the_child_outlives_its_parent(tmp_path):
    # The control: the same child without the preexec is orphaned and keeps running (what left a test's
    # `tr serve` holding the GPU after `timeout` ended pytest).
    out, child_pid = _kill_parent(tmp_path, with_preexec=False)
    try:
        assert not _wait_for(out, "signal", timeout_s=1.5)
        os.kill(child_pid, 0)  # still alive
    finally:
        os.kill(child_pid, signal.SIGKILL)
