"""Small wording a newcomer tripped over (issue 32, item 9): each message says what the user typed or what
happened, in one line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_call import call as _call

from tokenrouter.cli import tr, trsim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "saved-2026-12-01"


@pytest.mark.parametrize(
    ("main", "argv"),
    [(trsim.main, ["run", "--router-model", "randm"]),
     (tr.main, ["serve", "--small", "tiny-small", "--large", "tiny-large", "--router-model", "Randon", "--dry-run"])],
)  # fmt: skip
def test_a_typo_of_random_gets_the_suggestion(main, argv, capsys):
    rc, out, err = _call(main, argv, capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "did you mean 'random'?" in err


@pytest.mark.parametrize(
    ("main", "argv", "flag"),
    [(tr.main, ["bench", "--url", "http://127.0.0.1:9", "--num-requests", "0"], "--num-requests"),
     (trsim.main, ["run", "--num-requests", "0"], "--num-requests"),
     (trsim.main, ["run", "--seed", "-1"], "--seed"),
     (trsim.main, ["run", "--max-output", "0"], "--max-output")],
)  # fmt: skip
def test_a_bad_run_flag_is_named_as_typed(main, argv, flag, capsys):
    rc, _, err = _call(main, argv, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"Invalid value for {flag}:" in err and f" {flag[2:].replace('-', '_')} must" not in err, err


def test_check_config_of_a_migrated_v1_baseline_says_so(capsys):
    rc, out, err = _call(tr.main, ["check-config", str(FIXTURES / "serve_std_v1.yaml")], capsys)
    assert rc == 0, err
    assert "baseline: std-serving (instead of the routed runtime)" in out.splitlines()


def test_the_analytic_generator_runs_without_a_runpy_warning(tmp_path):
    out = tmp_path / "a.json"
    p = subprocess.run([sys.executable, "-m", "tokenrouter.calibration.analytic", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0 and out.exists(), p.stderr
    assert "Warning" not in p.stderr, p.stderr


def test_a_phase_after_the_last_request_is_marked_not_reached(tmp_path, capsys):
    spec = tmp_path / "late.json"
    phases = [{"at_s": 0.1, "hop_rate": 0.2}, {"at_s": 10_000, "hop_rate": 0.3}]
    spec.write_text(json.dumps({"workload": "fixed:16,16", "phases": phases}))
    rc, out, err = _call(trsim.main, ["run", "--workload", str(spec), "--num-requests", "64", "--thresholds", "1,1",
                                      "--json", str(tmp_path / "r.json")], capsys)  # fmt: skip
    assert rc == 0, err
    end = json.loads((tmp_path / "r.json").read_text())["duration_s"]
    assert 0.1 < end < 10_000, end  # the first phase falls in the run, the second after it
    lines = [line for line in out.splitlines() if line.startswith("phase at")]
    assert lines[0] == "phase at 0.1 s: hop rate 0.2"
    assert lines[1].startswith("phase at 10000.0 s: hop rate 0.3 (not reached: the run ended at ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("listen", "every"), [(":{port}", True), ("127.0.0.1:{port}", False)])
def test_link_probe_says_when_it_listens_on_every_interface(listen, every):
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "link-probe", "--listen", listen.format(port=_free_port())]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    assert first.startswith("link-probe listening on"), first
    assert ("every interface" in first) is every, first


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(capsys):
    """Whichever way the installed typer reports a Ctrl-C it caught (a silent exit code 130, or click's Abort), the
    command ends in one line."""
    from tokenrouter.cli.common import new_app, run_app

    app = new_app("demo", "A demo app.")

    @app.command("wait")
    def wait() -> None:
        raise KeyboardInterrupt

    @app.command("other")
    def other() -> None:
        pass

    with pytest.raises(SystemExit) as e:
        run_app(app, "demo", ["wait"])
    assert e.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["demo: error: interrupted"]
