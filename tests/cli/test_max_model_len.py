"""A --max-model-len past the models' context is refused in one line, exit 2, wherever a deployment is read (issue
32, item 5): trsim, tr serve before any process starts, tr check-config. It was served at the shorter length
without a word."""

from __future__ import annotations

import os
import signal
import socket
import sys

import pytest

from tokenrouter.bench.server import spawn
from tokenrouter.cli import tr, trsim
from tokenrouter.core.config import DeploymentConfig, ModelConfig, SchedulerConfig
from tokenrouter.models import load_spec

PAIR = ["--small", "tiny-small", "--large", "tiny-large"]


def _context() -> int:
    return min(load_spec(m).max_position_embeddings for m in ("tiny-small", "tiny-large"))


def _expect_refused(rc: int, err: str, given: int) -> None:
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"max_model_len {given}" in err and f"context of {_context()} tokens" in err, err


def test_trsim_refuses_it(capsys):
    too_long = _context() + 1
    with pytest.raises(SystemExit) as e:
        trsim.main(["run", *PAIR, "--profile", "h200-analytic", "--max-model-len", str(too_long)])
    _expect_refused(e.value.code, capsys.readouterr().err, too_long)
    with pytest.raises(SystemExit) as e:  # at the limit it runs
        trsim.main(["run", *PAIR, "--profile", "h200-analytic", "--max-model-len", str(_context()),
                    "--num-requests", "2", "--workload", "fixed:8,8"])  # fmt: skip
    assert e.value.code in (0, None)


def test_check_config_refuses_it(tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
                     scheduler=SchedulerConfig(max_model_len=100_000)).save(path)  # fmt: skip
    with pytest.raises(SystemExit) as e:
        tr.main(["check-config", str(path)])
    _expect_refused(e.value.code, capsys.readouterr().err, 100_000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_refuses_it_before_starting_anything():
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "serve", *PAIR, "--device", "cpu", "--port", str(_free_port()),
           "--max-model-len", "100000"]  # fmt: skip
    p = spawn(cmd)
    try:
        _, err = p.communicate(timeout=120)  # a server that started anyway never returns: the timeout fails the test
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    _expect_refused(p.returncode, err, 100_000)
    assert "starting" not in err
