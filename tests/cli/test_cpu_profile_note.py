"""The tools that load a profile measured on CPU say, in one line, that it checks the tool and not a GPU's speed
(issue 32, item 3): trsim run, tune and sweep, and tr bench --sim (in test_bench_cli)."""

from __future__ import annotations

import msgspec
import pytest

from tokenrouter.calibration import load_profile
from tokenrouter.cli import trsim

NOTE = "was measured on CPU by tr calibrate --device cpu: it checks the tool, not a GPU's speed"


@pytest.fixture
def cpu_profile(tmp_path):
    """The bundled analytic profile marked as a CPU calibration marks it (what it prices does not matter here)."""
    return msgspec.structs.replace(load_profile("h200-analytic"), device="cpu").save(tmp_path / "cpu.json")


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        trsim.main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


SMALL = ["--small", "tiny-small", "--large", "tiny-large", "--workload", "fixed:8,8"]
COMMANDS = {
    "run": ["run", *SMALL, "--num-requests", "4", "--thresholds", "1,1"],
    "tune": ["tune", *SMALL, "-n", "1", "--top", "1", "--num-requests", "32", "-o", "{tmp}/t.yaml"],
    "sweep": ["sweep", *SMALL, "--num-requests", "4", "--thresholds", "1,1", "-o", "{tmp}/s.csv"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_cpu_profile_is_named_once(command, cpu_profile, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    rc, _, err = _run([*argv, "--profile", str(cpu_profile)], capsys)
    assert rc == 0, err
    said = [line for line in err.splitlines() if NOTE in line]
    assert said == [f"trsim {command}: profile {cpu_profile} {NOTE}; do not choose B or read throughput from it"]
    rc, _, err = _run([*argv, "--profile", "h200-analytic"], capsys)
    assert rc == 0 and NOTE not in err
