"""`tr serve` checks files, port, device and host memory before any process starts: one line, exit 2; a subserver
that fails during start-up is one line naming it, exit 1, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from served import free_port

from tokenrouter.core.config import DeploymentConfig, ModelConfig, RouterConfig
from tokenrouter.runtime import preflight as pf

PAIR = ("--small", "tiny-small", "--large", "tiny-large")


def tr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli.tr", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def pair(**router) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")], router=RouterConfig(**router)
    )


def test_missing_files_are_named(tmp_path):
    with pytest.raises(pf.PreflightError, match=r"router checkpoint /nonexistent.pt not found"):
        pf.check_files(pair(weights="/nonexistent.pt"))
    pf.check_files(pair(weights="random"))
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small", path=str(tmp_path / "nope")), ModelConfig("tiny-large")])
    with pytest.raises(pf.PreflightError, match=r"weights directory .*nope not found"):
        pf.check_files(cfg)


def test_port_out_of_range_or_taken():
    for port in (-1, 0, 65536):
        with pytest.raises(pf.PreflightError, match=r"--port must be in 1\.\.65535"):
            pf.check_port("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(pf.PreflightError, match=f"--port {port}: cannot bind"):
            pf.check_port("127.0.0.1", port)
    pf.check_port("127.0.0.1", port)  # released


def test_no_cuda_device_names_device_cpu(monkeypatch):
    monkeypatch.setattr(pf.shutil, "which", lambda _: None)
    with pytest.raises(pf.PreflightError, match=r"no CUDA device found.*--device cpu"):
        pf.check_cuda(pair())


def test_weights_beyond_host_memory():
    with pytest.raises(pf.PreflightError, match=r"need .* GB on CPU .* 0\.0 GB of host memory is available"):
        pf.check_cpu_memory(pair(), available=1000)
    pf.check_cpu_memory(pair(), available=10**12)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--device", "cpu", "--router-model", "/nonexistent.pt"), "router checkpoint /nonexistent.pt not found"),
        (("--device", "cpu", "--port", "-1"), "--port must be in 1..65535, got -1"),
        (("--device", "cpu", "--small", "qwen3-32b", "--large", "qwen3-32b", "--kv-tokens", "16"), "on CPU"),
    ],
)
def test_serve_refuses_before_loading(args, needle):
    # A port this test owns (8000 may be taken on the machine; the port is checked before what each case tests).
    port = () if "--port" in args else ("--port", str(free_port()))
    r = tr("serve", *PAIR, *args, *port)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


@pytest.mark.runtime
def test_subserver_start_up_failure_is_one_line_exit_1(tmp_path):
    bad = tmp_path / "router.pt"
    bad.write_text("not a checkpoint")
    port = free_port()  # a port this test owns: one in use is refused before what this test checks
    r = tr("serve", *PAIR, "--device", "cpu", "--router-model", str(bad), "--port", str(port),
           "--log-level", "warning")  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    # what runs is said before loading, even at --log-level warning
    assert "tr serve: models: tiny-small, tiny-large on cpu" in r.stderr
    assert f"tr serve: url: http://127.0.0.1:{port}/v1" in r.stderr
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith("tr: error: subserver 0 (tiny-small) failed during start-up: ValueError: cannot read router")
    ), r.stderr
