from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_call import call

from tokenrouter.cli import tr, trsim

FAST = ["--workload", "fixed:16,40", "--num-requests", "8", "--concurrency", "4"]


def assert_one_line_error(rc: int, err: str, needle: str) -> None:
    assert rc == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--hop-rate", "1.5"], "--hop-rate must be in [0, 1]"),
        (["run", "--hop-rate", "-0.1"], "--hop-rate must be in [0, 1]"),
        (["run", "--thresholds", "4,5", "--concurrency", "4"], "infeasible"),
        (["run", "--thresholds", "1,2,3"], "one value per model"),
        (["run", "--workload", "medium-effort"], "medium-effort"),
        (["run", "--policy", "fastest"], "fastest"),
        (["run", "--placement", "moon"], "moon"),
        (["run", "--concurrency", "0"], "concurrency"),
        (["run", "--hop-rate", "abc"], "--hop-rate"),
        (["run", "--no-such-flag"], "no-such-flag"),
        (["run", "--async"], "--async"),  # renamed: CPU-GPU overlap is --overlap
        (["model", "--step-ms", "6,27.9", "--hop-rate", "2", "--concurrency", "4"], "error"),
        (["model", "--step-ms", "6,27.9", "--hop-rate", "0.3", "--concurrency", "4", "--thresholds", "4,4"], "error"),
        # The Markov search's time grows with N even within its state budget: past the limit, refused at once.
        (["model", "--step-ms", "6,27.9", "--hop-rate", "0.1", "--concurrency", "100000"], "N <= 1,024"),
        (["model", "--step-ms", "6,27.9", "-p", "0.1", "-n", "100000", "--thresholds", "1,9"], "N <= 1,024"),
        (["run", "--concurrency", "100000", "--num-requests", "4"], "--thresholds"),
        (["tune", "--concurrency", "8,100000", "--dry-run"], "N <= 1,024"),
        # A tp that does not split the model's heads cannot be deployed (the engine refuses it): not simulated either.
        (["run", "--tp", "3", "--dry-run"], "tp=3 does not divide"),
        (["run", "--placement", "separate", "--tp", "1,16", "--dry-run"], "its 8 KV heads"),
        (["cost", "--model", "qwen3-32b", "--tp", "3"], "tp=3 does not divide"),
        (["tune", "--placements", "tp", "--num-gpus", "16", "-n", "2"], "its 8 KV heads"),
        (["tune", "-n", "2", "--top", "-1"], "--top must be >= 1"),  # it dropped the last candidate
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    rc, _, err = call(trsim.main, argv, capsys)
    assert_one_line_error(rc, err, needle)


def test_malformed_profile_file(tmp_path: Path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 1, "kind": "measured"')
    rc, _, err = call(trsim.main, ["run", "--profile", str(bad), *FAST], capsys)
    assert_one_line_error(rc, err, "broken.json")


def test_malformed_trace_file(tmp_path: Path, capsys):
    bad = tmp_path / "hops.jsonl"
    bad.write_text(
        '{"id": "a", "prompt_len": 10, "runs": [[0, 3]]}\n{"id": "b", "prompt_len": 10, "runs": [[0, -2]]}\n'
    )
    rc, _, err = call(trsim.main, ["run", "--router", "trace", "--workload", str(bad), "--thresholds", "1,1"], capsys)
    assert_one_line_error(rc, err, "hops.jsonl:2")


def test_run_prints_table_and_writes_json_csv_plot(tmp_path: Path, capsys):
    j, c, p = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    rc, out, _ = call(trsim.main, ["run", *FAST, "--json", str(j), "--csv", str(c), "--plot", str(p)], capsys)
    assert rc == 0
    assert "output throughput tok/s" in out and "MEASURED on NVIDIA H200" in out and "thresholds B" in out
    rec = json.loads(j.read_text())
    assert rec["requests_completed"] == 8 and rec["total_output_tokens"] == 8 * 40
    assert rec["profile_kind"] == "measured"
    rc, out, _ = call(trsim.main, ["run", *FAST, "--profile", "h200-analytic"], capsys)
    assert rc == 0 and "ANALYTIC" in out
    assert len(c.read_text().strip().splitlines()) == 9
    assert p.stat().st_size > 10_000


def _capture_titles(monkeypatch) -> list[str]:
    """Suptitles of the figures the plots module builds (the PNG itself has no text to read back)."""
    import tokenrouter.plots as plots

    titles: list[str] = []
    build = plots.build_figure

    def spy(runs, title=None):
        fig = build(runs, title)
        titles.append(fig.get_suptitle())
        return fig

    monkeypatch.setattr(plots, "build_figure", spy)
    return titles


def test_run_plot_says_wrote_and_names_the_cell(tmp_path: Path, capsys, monkeypatch):
    titles = _capture_titles(monkeypatch)
    p = tmp_path / "cell.png"
    argv = ["run", *FAST, "--profile", "h200-analytic", "--small", "tiny-small", "--large", "tiny-large",
            "--hop-rate", "0.3", "--thresholds", "1,2", "--plot", str(p)]  # fmt: skip
    rc, out, _ = call(trsim.main, argv, capsys)
    assert rc == 0 and out.strip().splitlines()[-1] == f"wrote {p}"
    assert titles == ["trsim run: tiny-small + tiny-large\nrouter r2r, hop rate 0.3, policy delayed, B = 1,2, N = 4"]
    # With --json - stdout stays one JSON document; the notice goes to stderr.
    rc, out, err = call(trsim.main, ["run", *FAST, "--json", "-", "--plot", str(p)], capsys)
    assert rc == 0 and json.loads(out)["requests_completed"] == 8 and f"wrote {p}" in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", *FAST, "--json", "{missing}/r.json"], "--json"),
        (["run", *FAST, "--csv", "{missing}/r.csv"], "--csv"),
        (["run", *FAST, "--plot", "{missing}/r.png"], "--plot"),
        (["run", *FAST, "--plot", "{tmp}/r.txt"], "--plot"),
        (["run", *FAST, "--json", "{tmp}"], "--json"),
        (["sweep", *FAST, "--hop-rate", "0.1,0.2", "-o", "{missing}/s.csv"], "--out"),
        (["sweep", *FAST, "--hop-rate", "0.1,0.2", "--plot", "{missing}/s.png"], "--plot"),
        (["tune", "-n", "2", "--workload", "fixed:16,40", "-o", "{missing}/serve.yaml"], "--out"),
    ],
)
def test_unwritable_output_fails_before_simulating(argv, flag, tmp_path: Path, capsys):
    """A destination that cannot be written (its folder missing, a folder itself, a format matplotlib lacks) is a
    one-line error naming the flag before any simulation runs, not after minutes of work are thrown away."""
    missing = tmp_path / "no" / "such"
    argv = [a.format(missing=missing, tmp=tmp_path) for a in argv]
    rc, out, err = call(trsim.main, argv, capsys)
    assert_one_line_error(rc, err, flag)
    assert out == "" and "sweep" not in err and "tune" not in err  # no table, no progress bar: nothing ran
    assert not missing.exists()


def test_run_json_to_stdout_is_pure_json(capsys):
    rc, out, _ = call(trsim.main, ["run", *FAST, "--thresholds", "1,2", "--json", "-"], capsys)
    assert rc == 0 and json.loads(out)["thresholds"] == "1,2"


def test_model_prints_number_last(capsys):
    argv = [
        "model",
        "--step-ms",
        "6.0,27.9",
        "--hop-rate",
        "0.35",
        "--concurrency",
        "4",
        "--thresholds",
        "1,3",
        "--delta-ms",
        "0.1",
    ]
    rc, out, _ = call(trsim.main, argv, capsys)
    assert rc == 0 and float(out.strip().splitlines()[-1]) > 0


def test_overlap_flag_reaches_the_deployment_and_the_record(capsys):
    for flag, want in (("--overlap", True), ("--no-overlap", False)):
        rc, out, _ = call(trsim.main, ["run", *FAST, "--thresholds", "1,1", flag, "--json", "-"], capsys)
        rec = json.loads(out)
        assert rc == 0 and rec["overlap"] is want and "async" not in rec
        assert (rec["wasted_rows"] > 0) is want  # the default hop rate wastes prepared rows only with overlap


def test_sweep_writes_grid(tmp_path: Path, capsys):
    out_csv, png = tmp_path / "s.csv", tmp_path / "s.png"
    argv = [
        "sweep",
        "-o",
        str(out_csv),
        "--plot",
        str(png),
        "--hop-rate",
        "0.05,0.2",
        "--policy",
        "eager,delayed",
        "--thresholds",
        "1,2",
        "--workload",
        "fixed:16,30",
        "--num-requests",
        "8",
        "--concurrency",
        "4",
    ]
    rc, _, _ = call(trsim.main, argv, capsys)
    assert rc == 0
    import pandas as pd

    df = pd.read_csv(out_csv)
    assert len(df) == 4 and set(df["arg_policy"]) == {"eager", "delayed"}
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("axis", "needle"),
    [
        (["--workload", "fixed:16,40,nope"], "unknown workload 'nope'"),
        (["--seed", "0,-1"], "seed"),
        (["--max-output", "none,0"], "max_output"),
        (["--profile", "h200,nope"], "nope"),
        (["--small", "qwen3-0.6b,nope"], "nope"),
        (["--router", "r2r,trace", "--thresholds", "1,1"], "hop trace"),
    ],
)
def test_sweep_checks_every_point_before_running_any(axis, needle, tmp_path: Path, capsys):
    """The second point is bad: found before the first runs (one line on stderr: no progress bar was drawn)."""
    out = tmp_path / "s.csv"
    argv = ["sweep", "--workload", "fixed:16,40", "--num-requests", "4", "-n", "2", "-o", str(out), *axis]
    rc, _, err = call(trsim.main, argv, capsys)
    assert_one_line_error(rc, err, needle)


def test_tune_writes_config_that_tr_accepts_and_trsim_runs(tmp_path: Path, capsys):
    cfg = tmp_path / "serve.yaml"
    argv = [
        "tune",
        "-o",
        str(cfg),
        "--concurrency",
        "2,4",
        "--workload",
        "fixed:16,60",
        "--num-requests",
        "16",
        "--top",
        "2",
    ]
    rc, out, _ = call(trsim.main, argv, capsys)
    assert rc == 0 and "chosen B" in out
    data = yaml.safe_load(cfg.read_text())
    assert set(data["policy"]["table"]) == {2, 4}
    assert all(sum(b - 1 for b in bs) < n for n, bs in data["policy"]["table"].items())
    rc, out, _ = call(tr.main, ["check-config", str(cfg)], capsys)
    assert rc == 0 and "ok" in out
    rc, out, _ = call(trsim.main, ["run", "--config", str(cfg), *FAST], capsys)
    assert rc == 0 and "delayed" in out


def test_tr_check_config_rejects_bad_yaml(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [{name: qwen3-0.6b}]\nplacement: {mode: moon}\n")
    rc, _, err = call(tr.main, ["check-config", str(bad)], capsys)
    assert_one_line_error(rc, err, "moon")


def test_console_scripts_installed():
    out = subprocess.run(
        [sys.executable, "-m", "tokenrouter.cli.trsim", "run", "--hop-rate", "7"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
