"""A subserver imports only what it runs, and Ctrl-C while `tokenrouter serve` starts ends in one line (issue 32,
item 6). Before, every spawned subserver ran the CLI again (multiprocessing's spawn re-runs the parent's main),
loading the simulator and scipy, and a Ctrl-C then printed one KeyboardInterrupt traceback per subserver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
from served import free_port

from tokenrouter.runtime.parent_watch import term_when_parent_dies

HERE = Path(__file__).resolve().parent
# What a subserver never runs: the CLI (all its commands), the simulator and what only the simulator needs.
NOT_RUN = ("tokenrouter.cli.tr", "tokenrouter.sim", "tokenrouter.markov", "scipy", "pandas", "simpy")


def test_a_subserver_does_not_import_the_cli_that_started_it(tmp_path):
    """The launcher started as a console script starts it: a main that imports the whole CLI (the probe stands in
    for the subserver and records the modules its process loaded)."""
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(f"""
        import tokenrouter.cli.tr  # what the `tokenrouter` console script imports first
        import spawn_probe
        from tokenrouter.core.config import DeploymentConfig, ModelConfig
        from tokenrouter.runtime.launcher import Server, StartupError

        class Probe(Server):
            def subserver_target(self, spec):
                return spawn_probe.write_modules, {str(tmp_path)!r} + f"/sub{{spec.model}}.txt"

        if __name__ == "__main__":
            cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")])
            try:
                Probe(cfg, device="cpu").start()
            except StartupError:
                pass  # the probe exits instead of reporting Ready
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    for i in (0, 1):
        loaded = set((tmp_path / f"sub{i}.txt").read_text().split())
        assert not loaded & set(NOT_RUN), sorted(loaded & set(NOT_RUN))


def _spawn_with_default_sigint(cmd: list[str]) -> subprocess.Popen:
    """`cmd` in a session of its own (signalled as a group), stopped with this process, with SIGINT at its default:
    a suite started in the background of a script runs with SIGINT ignored and its children inherit that, which a
    terminal's Ctrl-C never meets."""

    def before_exec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        term_when_parent_dies()

    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=before_exec, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _subservers(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children() if "spawn_main" in " ".join(c.cmdline())]


def test_ctrl_c_while_the_subservers_start_is_one_line(tmp_path):
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "serve", "--small", "tiny-small", "--large", "tiny-large",
           "--device", "cpu", "--port", str(free_port())]  # fmt: skip
    p = _spawn_with_default_sigint(cmd)
    try:
        launcher = psutil.Process(p.pid)
        deadline = time.monotonic() + 60
        while len(_subservers(launcher)) < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        children = _subservers(launcher)
        assert len(children) == 2, "both subservers are starting (importing torch) when Ctrl-C comes"
        os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired as e:  # seen twice under two concurrent suites: keep what it shows
            try:
                stuck = [(c.pid, c.status(), " ".join(c.cmdline())[:100]) for c in launcher.children(recursive=True)]
            except psutil.Error as why:  # the launcher itself is gone: something else holds its pipes
                stuck = [repr(why)]
            os.killpg(p.pid, signal.SIGKILL)
            _, rest = p.communicate()
            early = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise AssertionError(f"no exit 60 s after Ctrl-C; processes: {stuck}; stderr:\n{early}{rest}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == ["tr: error: interrupted during start-up; every process it started has stopped"], err
    assert err.splitlines()[-1] == errors[0]
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


def test_the_serving_cli_does_not_import_the_simulator():
    """`tr serve` and `tr bench` load the whole `tr` app first: without the simulator (its scipy, pandas, simpy),
    which only `tr bench --sim` runs, so the window in which a Ctrl-C meets a half-imported CLI is short."""
    code = f"import sys, tokenrouter.cli.tr; print(sorted(m for m in {NOT_RUN[1:]!r} if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
