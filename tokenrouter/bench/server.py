"""A `tokenrouter serve` started as a separate process for studies and live benchmarks: start it, wait until
/health answers, read its /metrics, stop it (SIGTERM: it drains; SIGKILL to its process group if it hangs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from tokenrouter.runtime.parent_watch import term_when_parent_dies

TR = [sys.executable, "-m", "tokenrouter.cli.tr"]


def spawn(cmd: Sequence[str], out: Path | IO[str] | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cmd` in a session of its own (signalled as a group), told to stop when this process ends however it ends;
    output to `out` (a path or an open file; None: text pipes), `env` added to this process's environment."""
    io: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    if out is not None:
        io = {"stdout": out.open("w") if isinstance(out, Path) else out, "stderr": subprocess.STDOUT}
    return subprocess.Popen(list(cmd), start_new_session=True, preexec_fn=term_when_parent_dies,
                            env={**os.environ, **(env or {})}, **io)  # fmt: skip


def start_server(args: Sequence[str], port: int, log: Path, *, timeout_s: float = 420.0,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, float | None]:  # fmt: skip
    """`tokenrouter serve ARGS --port PORT`, output to `log`: (process, URL, seconds until /health answered 200;
    None when it did not come up within `timeout_s`, its process group then killed)."""
    cmd = [*TR, "serve", *args, "--port", str(port)]
    t0 = time.monotonic()
    proc = spawn(cmd, log, env)
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() - t0 < timeout_s and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its children too, also when the launcher itself already exited
    proc.wait()
    return proc, url, None


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> float:
    """SIGTERM (the server drains and exits), SIGKILL to the group after `timeout_s`; the seconds it took."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.monotonic() - t0


def scrape(url: str) -> dict[str, float]:
    """/metrics as {series with labels: value}."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out
