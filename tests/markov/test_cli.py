"""`trsim model` with --router/--mean-output, and large N on the command lines: one-line errors (exit 2) or a
reduced search that says so, never a traceback; `--help` says how large N can be."""

from __future__ import annotations

import pytest

from tokenrouter.cli import trsim
from tokenrouter.markov import feasible_thresholds

ME = ["model", "--router", "me", "--step-ms", "0.9,4.6,17.0", "--concurrency", "4"]


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        trsim.main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def test_me_lockstep_without_completions(capsys) -> None:
    rc, out, _ = call([*ME, "--thresholds", "1,1,1"], capsys)
    assert rc == 0
    assert float(out.strip().splitlines()[-1]) == pytest.approx(1000 * 4 / (0.9 + 4.6 + 17.0), abs=0.01)


def test_me_two_groups_with_completions(capsys) -> None:
    # Requests end and their replacements fall out of step: two groups alternate on the slowest model.
    rc, out, _ = call([*ME, "--thresholds", "1,1,1", "--mean-output", "400"], capsys)
    assert rc == 0 and "mean output 400" in out
    assert float(out.strip().splitlines()[-1]) == pytest.approx(1000 * 4 / (2 * 17.0), abs=0.01)


def test_me_search_prefers_holding_the_group(capsys) -> None:
    rc, out, _ = call([*ME, "--mean-output", "400"], capsys)
    b, t = out.strip().splitlines()[-1].split()
    assert rc == 0 and b != "B*=1,1,1" and float(t.removeprefix("T=")) > 1000 * 4 / (2 * 17.0)


def test_large_search_is_reduced_and_says_so(capsys) -> None:
    argv = ["model", "--step-ms", "6,27.9", "--hop-rate", "0.1", "-n", "64", "--max-states", "5000"]
    rc, out, err = call(argv, capsys)
    assert rc == 0 and err == ""
    lines = out.strip().splitlines()
    assert lines[-2].startswith("note: Markov search for N=64")
    b = tuple(int(x) for x in lines[-1].split()[0].removeprefix("B*=").split(","))
    assert b in feasible_thresholds(2, 64)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            [
                "model",
                "--step-ms",
                "6,27.9",
                "--hop-rate",
                "0.1",
                "-n",
                "64",
                "--thresholds",
                "1,1",
                "--max-states",
                "50",
            ],
            "exceeds 50 states",
        ),
        ([*ME, "--hop-rate", "0.1"], "does not apply"),
        ([*ME, "--mean-output", "0.5"], "mean output"),
        ([*ME, "--thresholds", "1,1"], "need 3 thresholds"),
        (["model", "--router", "me", "--step-ms", "5", "-n", "2"], "at least 2 models"),
        (["model", "--router", "moe", "--step-ms", "5,6", "-n", "2"], "--router"),
        (["model", "--step-ms", "6,27.9,3", "--hop-rate", "0.1", "-n", "2"], "2 step times"),
        ([*ME, "--max-states", "0"], "--max-states"),
    ],
)
def test_model_errors_are_one_line(args: list[str], needle: str, capsys) -> None:
    rc, _, err = call(args, capsys)
    assert rc == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_run_at_large_n_falls_back_instead_of_crashing(capsys) -> None:
    # The case: `trsim run -n 64` with the default --thresholds auto used to die in the Markov search.
    rc, out, err = call(["run", "-n", "64", "--workload", "fixed:16,24", "--num-requests", "64"], capsys)
    assert rc == 0 and "Traceback" not in err
    text = " ".join(out.split())  # the report wraps long lines
    assert "auto: best of" in text and "simulated at N=64" in text


@pytest.mark.parametrize(("command", "says"), [("run", "N > 1024 is refused"), ("model", "exact up to about N = 8"),
                                              ("tune", "N > 1024 is refused")])  # fmt: skip
def test_help_says_how_large_n_can_be(command: str, says: str, capsys) -> None:
    rc, out, _ = call([command, "--help"], capsys)
    text = " ".join(out.replace("│", " ").split())  # rich boxes and wraps the help
    assert rc == 0 and says in text
