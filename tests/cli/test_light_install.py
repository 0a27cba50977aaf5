"""`tokenrouter serve` / `tokenrouter bench` in an install without the extras they need (the quick start's venv
has only the simulator): one line naming the extra and the missing modules, exit 2, no traceback.

Nothing is uninstalled: a subprocess blocks the modules (`sys.modules[name] = None` makes any import of them
fail, as if absent) before it runs the CLI's main."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# pydantic is in the serve extra but also arrives with typer (recent typer depends on it), so it stays importable.
SERVE_EXTRA = ["tokenizers", "zmq", "fastapi", "uvicorn", "prometheus_client", "httpx"]
ENGINE_EXTRA = ["torch", "safetensors", "triton"]


def run_without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for m in {modules!r}: sys.modules[m] = None\n"
        "from tokenrouter.cli.tr import main_tokenrouter\n"
        f"main_tokenrouter({argv!r})\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


SERVE = ["serve", "--small", "tiny-small", "--large", "tiny-large", "--device", "cpu", "--port", "9"]


@pytest.mark.parametrize(
    ("blocked", "argv", "line"),
    [
        (SERVE_EXTRA + ENGINE_EXTRA, SERVE,
         "serve needs the 'serve' and 'engine' extras (missing: tokenizers, zmq, fastapi, uvicorn, "
         "prometheus_client, httpx, torch, safetensors): pip install 'tokenrouter[serve,engine]'"),
        (["zmq"], SERVE, "serve needs the 'serve' extra (missing: zmq): pip install 'tokenrouter[serve]'"),
        (["torch"], SERVE, "serve needs the 'engine' extra (missing: torch): pip install 'tokenrouter[engine]'"),
        (SERVE_EXTRA + ENGINE_EXTRA, ["bench", "--url", "http://127.0.0.1:9"],
         "bench needs the 'serve' extra (missing: prometheus_client, httpx): pip install 'tokenrouter[serve]'"),
    ],
)  # fmt: skip
def test_a_command_without_its_extra_is_one_line_and_exit_2(blocked, argv, line):
    p = run_without(blocked, argv)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"tokenrouter: error: {line}"], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_simulator_commands_still_run_without_the_extras():
    p = run_without(SERVE_EXTRA + ENGINE_EXTRA, ["models"])
    assert p.returncode == 0 and "qwen3-32b" in p.stdout, p.stderr


def test_calibrate_without_its_extras_stops_before_measuring(tmp_path):
    out = tmp_path / "p.json"
    p = run_without(SERVE_EXTRA + ENGINE_EXTRA, ["calibrate", "-m", "qwen3-0.6b", "-o", str(out)])
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        "tokenrouter: error: calibrate needs the 'engine' and 'serve' extras (missing: torch, safetensors, "
        "tokenizers, zmq, fastapi, uvicorn, prometheus_client, httpx): pip install 'tokenrouter[engine,serve]'"
    ], p.stderr
    assert not list(tmp_path.iterdir())  # no partial to "resume": nothing could have been measured


def test_calibrate_on_a_machine_without_a_gpu_says_so_at_once(tmp_path):
    """Without a CUDA device (hidden here, so the test means the same on a GPU machine) `tr calibrate` stops with
    one line pointing at --device cpu, instead of failing every task and asking to run it again (exit 3)."""
    out = tmp_path / "p.json"
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "calibrate", "-m", "tiny-small", "-o", str(out)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1 and "no CUDA GPU" in p.stderr and "--device cpu" in p.stderr, p.stderr
    assert not list(tmp_path.iterdir())
