"""`tokenrouter.bench.server.start_server`, which the studies use: a server that does not come up (it exits, or it
is not healthy in time) comes back as None with its process group gone, so the caller's next server finds the
port, the memory and the GPU free."""

from __future__ import annotations

import os
import socket
import time

from tokenrouter.bench.server import start_server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_that_exits_is_none(tmp_path):
    log = tmp_path / "serve.log"
    proc, _, up = start_server(["--config", str(tmp_path / "missing.yaml")], _free_port(), log, timeout_s=60)
    assert up is None and proc.returncode not in (None, 0)
    assert "missing.yaml" in log.read_text()


def test_a_server_not_up_in_time_is_killed_with_its_children(tmp_path):
    # The tiny pair on CPU needs seconds to start its subservers: 1 s is too short, and the launcher has
    # children by then.
    args = ["--small", "tiny-small", "--large", "tiny-large", "--device", "cpu"]
    proc, _, up = start_server(args, _free_port(), tmp_path / "serve.log", timeout_s=1.0)
    assert up is None and proc.returncode is not None
    deadline = time.monotonic() + 15  # SIGKILL is delivered, and the orphans reaped, a moment later
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid)
