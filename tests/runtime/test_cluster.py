"""tcp:// peers and subservers started by hand (`runtime.cluster`, `runtime.join`, `tokenrouter subserver`), on
loopback with the tiny CPU pair in real processes; tokens compared with the ipc run (`cluster_helpers`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from cluster_helpers import on_tcp, serve_prompts, with_external
from rt_helpers import tiny_config

from tokenrouter.bench.server import spawn
from tokenrouter.runtime.addresses import is_tcp, split_tcp
from tokenrouter.runtime.cluster import ClusterOptions
from tokenrouter.runtime.launcher import Server, StartupError


def test_tcp_on_loopback_gives_the_tokens_of_ipc(tmp_path, reference):
    cfg, want = reference
    srv = Server(on_tcp(cfg), run_dir=tmp_path)
    got = serve_prompts(srv)
    a = srv.addresses
    assert all(is_tcp(x) and split_tcp(x)[0] == "127.0.0.1" for x in (a.frontend, a.coordinator, *a.subservers))
    assert a.listen == "127.0.0.1"  # everything on this host: nothing listens beyond loopback
    assert got == want


def test_fixed_ports_and_a_sync_policy_over_tcp(tmp_path, reference):
    """port_base: every endpoint at its documented offset; model-sync's coordinator also talks tcp."""
    cfg, want = reference
    base = _free_port_range(4 + len(cfg.models))
    srv = Server(on_tcp(replace(cfg, policy=replace(cfg.policy, kind="model-sync")), port_base=base), run_dir=tmp_path)
    got = serve_prompts(srv)
    a = srv.addresses
    ports = [split_tcp(x)[1] for x in (a.frontend, a.coordinator, a.launcher, *a.subservers)]
    assert ports == [base, base + 1, base + 2, base + 4, base + 5]
    assert srv.coordinator is not None and srv.coordinator.grants > 0
    assert got == want


def _free_port_range(n: int) -> int:
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000)
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def write(cfg, path: Path) -> Path:
    path.write_text(cfg.to_yaml())
    return path


def start_subserver(config: Path, model: str, join: str, log: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "subserver", "--config", str(config), "--model", model,
           "--join", join, *extra]  # fmt: skip
    return spawn(cmd, log, {"OMP_NUM_THREADS": "1"})


def test_an_external_subserver_joins_serves_the_same_tokens_and_leaves_on_stop(tmp_path, reference):
    cfg, want = reference
    cfg = with_external(cfg)
    path = write(cfg, tmp_path / "cfg.yaml")
    srv = Server(cfg, run_dir=tmp_path, cluster=ClusterOptions(config_path=str(path)))
    proc = start_subserver(path, "tiny-large", srv.addresses.launcher, tmp_path / "sub.log")
    try:
        got = serve_prompts(srv)  # stop() sends Shutdown: the hand-started process leaves and exits by itself
        assert proc.wait(timeout=30) == 0, (tmp_path / "sub.log").read_text()[-2000:]
    finally:
        _kill(proc)
    assert srv.processes[1].exit_reason.startswith("left")
    assert got == want


def test_a_silent_external_subserver_fails_the_server(tmp_path):
    """SIGKILL of the hand-started process: no Failed, no exit code to read; its heartbeats stop."""
    cfg = with_external(tiny_config())
    path = write(cfg, tmp_path / "cfg.yaml")
    srv = Server(cfg, run_dir=tmp_path, stats_interval_s=0.1, cluster=ClusterOptions(heartbeat_timeout_s=2.0))
    gave_up: list[str] = []
    srv.add_fatal_listener(gave_up.append)
    proc = start_subserver(path, "1", srv.addresses.launcher, tmp_path / "sub.log")
    try:
        srv.start()
        assert srv.healthy()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not gave_up and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gave_up and "tiny-large" in gave_up[0] and "no heartbeat" in gave_up[0], gave_up
        assert not srv.is_alive(1) and srv.is_alive(0)
    finally:
        srv.stop()
        _kill(proc)


def test_a_subserver_that_never_joins_is_a_clear_start_up_error_and_a_wrong_one_is_refused(tmp_path):
    cfg = with_external(tiny_config())
    path = write(cfg, tmp_path / "cfg.yaml")
    other = write(replace(cfg, models=[replace(m, name="tiny-large") for m in cfg.models]), tmp_path / "other.yaml")
    srv = Server(cfg, run_dir=tmp_path, cluster=ClusterOptions(join_timeout_s=20.0, config_path=str(path)))
    wrong = start_subserver(other, "1", srv.addresses.launcher, tmp_path / "wrong.log", "--join-timeout", "60")
    try:
        with pytest.raises(StartupError) as e:
            srv.start()
        msg = str(e.value)
        assert "tiny-large" in msg and "did not join within 20 s" in msg
        assert f"tokenrouter subserver --config {path} --model tiny-large --join" in msg  # how to start it
        assert wrong.wait(timeout=60) == 2
        out = (tmp_path / "wrong.log").read_text()
        assert "refused" in out and "differs" in out, out
    finally:
        srv.stop()
        _kill(wrong)


def test_a_subserver_started_by_hand_exits_when_its_launcher_is_killed(tmp_path):
    """`tokenrouter serve` (its own process) with an external model; kill -9 of the server: the hand-started
    subserver, which is no child of it, notices its link to the launcher drop and exits."""
    from served import free_port

    cfg = with_external(tiny_config(), host="127.0.0.1")
    base = _free_port_range(6)
    launcher_port = base + 2  # runtime.addresses.TCP_OFFSETS
    cfg = replace(cfg, placement=replace(cfg.placement, port_base=base))
    path = write(cfg, tmp_path / "cfg.yaml")
    port = free_port()
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "serve", "--config", str(path), "--device", "cpu", "--port",
           str(port)]  # fmt: skip
    log = tmp_path / "serve.log"
    server = spawn(cmd, log, {"OMP_NUM_THREADS": "1"})
    sub = start_subserver(path, "tiny-large", f"tcp://127.0.0.1:{launcher_port}", tmp_path / "sub.log")
    try:
        import httpx

        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        os.killpg(server.pid, signal.SIGKILL)  # the server and its own children (model 0); not the subserver
        server.wait(timeout=10)
        assert sub.wait(timeout=60) != 0  # it exited by itself
        assert "lost the launcher" in (tmp_path / "sub.log").read_text()
    finally:
        _kill(sub)
        _kill(server)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
