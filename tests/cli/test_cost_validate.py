"""`trsim cost` (one step as the cost model prices it) and `trsim validate` (the simulator against a live-results
file), checked against hand computations from the profile's numbers and against `trsim run` itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_call import call as run_cli

from tokenrouter.calibration import load_profile
from tokenrouter.cli import trsim


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    return run_cli(trsim.main, argv, capsys)


def test_cost_of_a_decode_step_is_the_profile_formula(capsys):
    g = load_profile("h200-analytic").model("qwen3-0.6b").step.graph
    by_hand = g.c0 + g.c_row * 2 + g.c_ctx * 2 * 1024 + g.c_tok * 2  # 2 decode rows attending 1,024 tokens each
    rc, out, _ = call(["cost", "--model", "qwen3-0.6b", "--batch", "2", "--context", "1024",
                       "--profile", "h200-analytic"], capsys)  # fmt: skip
    assert rc == 0 and float(out.strip().splitlines()[-1]) == pytest.approx(by_hand, abs=1e-3)
    rc, out, _ = call(["cost", "--model", "qwen3-0.6b", "--batch", "2", "--context", "1024", "--corun",
                       "qwen3-32b:4", "--profile", "h200-analytic"], capsys)  # fmt: skip
    slowdown = load_profile("h200-analytic").mps.default_slowdown  # an unmeasured pair: the constant factor
    assert rc == 0 and float(out.strip().splitlines()[-1]) == pytest.approx(by_hand * slowdown, abs=1e-3)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--batch", "0"], "--batch"),
        (["--corun", "qwen3-32b"], "MODEL:BATCH"),
        (["--corun", "qwen3-32b:x"], "integer"),
        (["--sm-percent", "0"], "--sm-percent"),
        (["--context", "4", "--tokens-per-row", "8"], "--context"),
    ],
)
def test_cost_bad_input(argv, needle, capsys):
    rc, _, err = call(["cost", "--model", "qwen3-0.6b", *argv], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


CELLS = {
    "eager N=4": "--policy eager -n 4 --workload fixed:16,40 --num-requests 8 --profile h200-analytic",
    "delayed N=4": "--policy delayed --thresholds 1,2 -n 4 --workload fixed:16,40 --num-requests 8 "
    "--profile h200-analytic",
}


def _sim(args: str, capsys) -> dict:
    rc, out, _ = call(["run", *args.split(), "--json", "-"], capsys)
    assert rc == 0
    return json.loads(out)


def _live_csv(path: Path, rows: list[tuple[str, str, float, float]]) -> None:
    lines = ["cell,args,output_throughput_tok_s,tpot_ms_p50"]
    lines += [f'{c},"{a}",{t},{p}' for c, a, t, p in rows]
    path.write_text("\n".join(lines) + "\n")


def test_validate_reports_the_error_against_trsim_run(tmp_path, capsys):
    sims = {c: _sim(a, capsys) for c, a in CELLS.items()}
    # "Live" figures made from trsim run's own output: the simulator is 4% and 2% faster than these.
    rows = [(c, a, sims[c]["output_throughput_tok_s"] / f, sims[c]["tpot_ms_p50"])
            for (c, a), f in zip(CELLS.items(), (1.04, 1.02), strict=True)]  # fmt: skip
    live = tmp_path / "live.csv"
    _live_csv(live, rows)
    rc, out, _ = call(["validate", str(live), "--json", str(tmp_path / "v.json"), "--max-median-error", "0.05"],
                      capsys)  # fmt: skip
    assert rc == 0, out
    got = json.loads((tmp_path / "v.json").read_text())
    errs = sorted(c["err_throughput"] for c in got["cells"])
    assert errs == pytest.approx([0.02, 0.04], abs=1e-9)
    assert got["summary"]["throughput_median_abs_error"] == pytest.approx(0.03)
    assert got["summary"]["tpot_p50_max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    # The default thresholds (3% median) fail the same file: exit 1.
    rc, out, _ = call(["validate", str(live), "--max-median-error", "0.025"], capsys)
    assert rc == 1 and "OUTSIDE" in out


def test_validate_resolves_a_config_relative_to_the_csv_from_any_folder(tmp_path, capsys, monkeypatch):
    from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig

    (tmp_path / "configs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "elsewhere").mkdir()
    cfg = tmp_path / "configs" / "serve.yaml"
    DeploymentConfig(models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")],
                     policy=PolicyConfig("eager"), profile="h200-analytic").save(cfg)  # fmt: skip
    args = "--config ../configs/serve.yaml -n 2 --workload fixed:16,20 --num-requests 4"
    sim = _sim(args.replace("../configs/serve.yaml", str(cfg)), capsys)
    live = tmp_path / "results" / "live.csv"
    _live_csv(live, [("c", args, sim["output_throughput_tok_s"], sim["tpot_ms_p50"])])
    for cwd in (tmp_path / "elsewhere", tmp_path / "results"):
        monkeypatch.chdir(cwd)
        rc, out, _ = call(["validate", str(live)], capsys)
        assert rc == 0 and "+0.0%" in out, (cwd, out)


def test_validate_does_not_read_a_config_relative_to_the_working_folder(tmp_path, capsys, monkeypatch):
    # One rule: a path that exists from where the command runs but not from the CSV's folder is an error (the
    # same CSV must give the same result wherever it is validated from).
    from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig

    (tmp_path / "results").mkdir()
    DeploymentConfig(models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")],
                     policy=PolicyConfig("eager"), profile="h200-analytic").save(tmp_path / "serve.yaml")  # fmt: skip
    live = tmp_path / "results" / "live.csv"
    _live_csv(live, [("c", "--config serve.yaml -n 2 --workload fixed:16,20 --num-requests 4", 100.0, 5.0)])
    monkeypatch.chdir(tmp_path)
    rc, _, err = call(["validate", str(live)], capsys)
    assert rc == 2 and "line 2" in err and "serve.yaml" in err, err


def test_validate_bad_files(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("cell,output_throughput_tok_s\na,1\n")
    rc, _, err = call(["validate", str(tmp_path / "x.csv")], capsys)
    assert rc == 2 and "missing column" in err
    rc, _, err = call(["validate", str(tmp_path / "nope.csv")], capsys)
    assert rc == 2 and "nope.csv" in err


@pytest.mark.parametrize(
    ("row", "needles"),
    [
        ('c,"-n 2 --workload fixed:16,20 --num-requests 4",abc,5', ["line 3", "output_throughput_tok_s", "'abc'"]),
        ('c,"-n 2 --workload fixed:16,20 --num-requests 4",0,5', ["line 3", "output_throughput_tok_s", "> 0"]),
        ('c,"-n 2 --workload fixed:16,20 --num-requests 4",100,-1', ["line 3", "tpot_ms_p50"]),
        ('c,"-n 2 --bogus",100,5', ["line 3", "--bogus"]),
        ('c,"-n 2 --workload nope",100,5', ["line 3", "nope"]),
    ],
)
def test_validate_names_the_line_of_a_bad_cell_before_simulating(row, needles, tmp_path, capsys):
    live = tmp_path / "live.csv"
    good = 'a,"-n 2 --workload fixed:16,20 --num-requests 4",100,5'
    live.write_text(f"cell,args,output_throughput_tok_s,tpot_ms_p50\n{good}\n{row}\n")
    rc, out, err = call(["validate", str(live)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err  # one line: no progress bar either
    assert "live.csv" in err and all(n in err for n in needles), err


@pytest.mark.parametrize(
    "args",
    [
        "-n 2 --workload fixed:16,20 --num-requests 4",
        "--config serve.yaml --policy eager --hop-rate 0.2 -n 4 --seed 3 --max-output 64 --thresholds 1,7",
        "--thresholds auto --no-overlap --graphs --sm-percent 40,60 --arrival-rate 2.5 --profile=h200-analytic",
        "--models a,b,c --placement separate --tp 1,2,1 -p 0.3 --json - --dry-run",
    ],
)
def test_a_cell_parses_as_trsim_run_parses_its_flags(args):
    import inspect

    from typer.main import get_command

    from tokenrouter.cli.options import RUN_KEYS, parse_run_args, pop_deployment_flags
    from tokenrouter.sim.simulate import sim_config

    params = dict(get_command(trsim.app).commands["run"].make_context("run", args.split()).params)
    flags, run = parse_run_args(args.split())
    assert flags == pop_deployment_flags(params)
    defaults = {k: p.default for k, p in inspect.signature(sim_config).parameters.items() if k in RUN_KEYS}
    assert {**defaults, **run} == {k: params[k] for k in RUN_KEYS}
