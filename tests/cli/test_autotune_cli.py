"""`--autotune` and `policy.autotune` through the shared deployment flags: trsim runs the controller and reports the
B timeline, `tr serve` writes the setting into the deployment it runs, impossible combinations are one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml
from cli_call import call

from tokenrouter.cli import tr, trsim

SPEC = {"workload": "fixed:16,200", "phases": [{"at_s": 0, "hop_rate": 0.02}, {"at_s": 3, "hop_rate": 0.4}]}
CONFIG = {
    "models": [{"name": "qwen3-0.6b"}, {"name": "qwen3-32b"}],
    "policy": {"kind": "delayed", "thresholds": [1, 1],
               "autotune": {"interval_s": 2, "hold_s": 2, "half_life_s": 2, "min_steps": 20}},
}  # fmt: skip


@pytest.fixture
def files(tmp_path):
    spec, cfg = tmp_path / "shift.json", tmp_path / "serve.yaml"
    spec.write_text(json.dumps(SPEC))
    cfg.write_text(yaml.safe_dump(CONFIG))
    return spec, cfg


def test_trsim_run_reports_the_b_timeline(files, capsys):
    spec, cfg = files
    argv = ["run", "--config", str(cfg), "--workload", str(spec), "-n", "4", "--num-requests", "60"]
    rc, out, _ = call(trsim.main, [*argv, "--json", "-"], capsys)
    assert rc == 0
    rec = json.loads(out)
    assert rec["hop_rate"] == 0.02  # the phase at 0 s replaced the config's rate
    assert rec["autotune_initial"] == "1,1"
    parts = rec["autotune_timeline"].split(";")
    assert parts[0] == "0:1,1" and len(parts) == rec["autotune_changes"] + 1
    times = [float(p.split(":")[0]) for p in parts]
    assert times == sorted(times)
    # A change before the shift must be one the simulator agrees with at the first phase's hop rate (on the measured
    # profile, co-location makes (1,2) beat (1,1) even at hop rate 0.02): static runs of both B, compared.
    static = ["run", "--config", str(cfg), "--no-autotune", "--workload", "fixed:16,200", "--hop-rate", "0.02",
              "-n", "4", "--num-requests", "60", "--json", "-"]  # fmt: skip

    def steady(b: str) -> float:
        rc, out, _ = call(trsim.main, [*static, "--thresholds", b], capsys)
        assert rc == 0
        return json.loads(out)["steady_output_throughput_tok_s"]

    for p in parts[1:]:
        at, b = p.split(":")
        if float(at) <= 3:
            assert steady(b) > steady("1,1"), p
    if rec["autotune_changes"]:
        assert rec["thresholds"] == parts[-1].split(":")[1]
    rc, text, _ = call(trsim.main, argv, capsys)
    assert rc == 0
    assert "phase at 3.0 s: hop rate 0.4" in text and "autotune: B = 1,1 at the start" in text
    rc, out, _ = call(trsim.main, [*argv, "--no-autotune", "--json", "-"], capsys)
    assert rc == 0 and "autotune_timeline" not in json.loads(out)


def test_serve_flag_and_config_key(files, capsys):
    _, cfg = files
    base = ["serve", "--small", "tiny-small", "--large", "tiny-large", "--device", "cpu", "--dry-run"]
    rc, out, _ = call(tr.main, [*base, "--autotune"], capsys)
    assert rc == 0
    tune = yaml.safe_load(out)["policy"]["autotune"]
    assert tune["interval_s"] == 5.0 and tune["min_gain"] == 0.02 and tune["max_states"] == 50_000
    rc, out, _ = call(tr.main, base, capsys)
    assert rc == 0 and yaml.safe_load(out)["policy"]["autotune"] is None
    rc, out, _ = call(tr.main, ["serve", "--config", str(cfg), "--device", "cpu", "--dry-run"], capsys)
    assert rc == 0 and yaml.safe_load(out)["policy"]["autotune"]["interval_s"] == 2.0  # the config's settings
    rc, out, _ = call(tr.main, ["serve", "--config", str(cfg), "--device", "cpu", "--dry-run", "--no-autotune"],
                      capsys)  # fmt: skip
    assert rc == 0 and yaml.safe_load(out)["policy"]["autotune"] is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--autotune", "--policy", "step-sync"], "policy.autotune tunes delayed-batching thresholds"),
        (["--autotune", "--router", "trace", "--trace", "t.jsonl"], "needs a router the Markov model describes"),
    ],
)
def test_impossible_combinations_are_one_line_errors(argv, needle, capsys):
    rc, _, err = call(trsim.main, ["run", "--workload", "fixed:16,40", "--num-requests", "4", *argv], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_a_bad_config_value_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "policy": {"kind": "delayed", "autotune": {"min_gain": -1}}}))
    rc, _, err = call(tr.main, ["check-config", str(cfg)], capsys)
    assert rc == 2 and "policy.autotune.min_gain must be a number >= 0" in err and len(err.strip().splitlines()) == 1


def test_the_plot_marks_phases_and_b_changes():
    from types import SimpleNamespace

    from tokenrouter.cli.run_cmd import run_marks
    from tokenrouter.plots import RunSeries, build_figure

    last = SimpleNamespace(finish=10.0)  # the run ends after every mark
    res = SimpleNamespace(extra={"phases": [(0.0, 0.02, None), (3.0, 0.4, 8)],
                                 "autotune": {"changes": [{"at": 5.0, "new": [1, 3]}]}},
                          metrics=SimpleNamespace(completed=lambda: [last]))  # fmt: skip
    marks = run_marks(res)
    assert marks == [(3.0, "phase: p=0.4, N=8"), (5.0, "B=1,3")]
    fig = build_figure([RunSeries("sim", marks=marks)])
    ax = next(a for a in fig.axes if a.get_title() == "Output throughput over time")
    assert sorted(line.get_xdata()[0] for line in ax.get_lines()) == [3.0, 5.0]
    assert [t.get_text() for t in ax.texts] == ["phase: p=0.4, N=8", "B=1,3"]
