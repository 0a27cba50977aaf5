"""`tokenrouter serve` / `tokenrouter bench` in an install without the extras they need (the quick start's venv
has only the simulator): one line naming the extra and the missing modules, exit 2, no traceback.

Nothing is uninstalled: a subprocess blocks the modules (`sys.modules[name] = None` makes any import of them
fail, as if absent) before it runs the CLI's main."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


ENGINE_HINT = (
    'in the repository, pip install "torch==2.13.0" -e ".[{}]" (the CPU torch; on a GPU machine leave out the pin)'
)
SERVE_HINT = 'in the repository, pip install -e ".[serve]"'


@pytest.mark.parametrize(
    ("blocked", "argv", "line"),
    [
        (SERVE_EXTRA + ENGINE_EXTRA, SERVE,
         "serve needs the 'engine' and 'serve' extras (missing: torch, safetensors, tokenizers, zmq, fastapi, "
         f"uvicorn, prometheus_client, httpx): {ENGINE_HINT.format('engine,serve')}"),
        (["zmq"], SERVE, f"serve needs the 'serve' extra (missing: zmq): {SERVE_HINT}"),
        (["torch"], SERVE, f"serve needs the 'engine' extra (missing: torch): {ENGINE_HINT.format('engine')}"),
        (SERVE_EXTRA + ENGINE_EXTRA, ["bench", "--url", "http://127.0.0.1:9"],
         f"bench needs the 'serve' extra (missing: prometheus_client, httpx): {SERVE_HINT}"),
    ],
)  # fmt: skip
def test_a_command_without_its_extra_is_one_line_and_exit_2(blocked, argv, line):
    p = run_without(blocked, argv)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"tokenrouter: error: {line}"], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_the_install_hint_is_the_readmes_command():
    """The hint for the runtime's extras is, word for word, the README's CPU install of them (torch pinned to the
    CPU build), so following it does not pull a CUDA torch."""
    from tokenrouter.cli.common import install_hint

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    command = install_hint(["serve", "engine"]).removeprefix("in the repository, ").split(" (")[0]
    assert command == 'pip install "torch==2.13.0" -e ".[engine,serve]"'
    assert command in readme


def test_simulator_commands_still_run_without_the_extras():
    p = run_without(SERVE_EXTRA + ENGINE_EXTRA, ["models"])
    assert p.returncode == 0 and "qwen3-32b" in p.stdout, p.stderr


def test_calibrate_without_its_extras_stops_before_measuring(tmp_path):
    out = tmp_path / "p.json"
    p = run_without(SERVE_EXTRA + ENGINE_EXTRA, ["calibrate", "-m", "qwen3-0.6b", "-o", str(out)])
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        "tokenrouter: error: calibrate needs the 'engine' and 'serve' extras (missing: torch, safetensors, "
        f"tokenizers, zmq, fastapi, uvicorn, prometheus_client, httpx): {ENGINE_HINT.format('engine,serve')}"
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
