"""What a newcomer meets in the first hour (issue: errors before loading, `--version`, a start-up summary)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from cli_call import call as _call

from tokenrouter.cli import tr, trsim


@pytest.mark.parametrize(
    ("main", "prog"), [(tr.main, "tr"), (tr.main_tokenrouter, "tokenrouter"), (trsim.main, "trsim")]
)
def test_version_prints_the_package_version(main, prog, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert int(e.value.code or 0) == 0
    assert capsys.readouterr().out.strip() == f"{prog} (tokenrouter) {version('tokenrouter')}"


def test_the_deployment_summary_says_what_runs():
    from tokenrouter.core.config import AutotuneConfig, DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig
    from tokenrouter.deploy.summary import describe_deployment

    cfg = DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b", gpus=[1])],
        policy=PolicyConfig(kind="delayed", thresholds=[1, 4], table={4: [1, 3]}, autotune=AutotuneConfig()),
        router=RouterConfig(hop_rate=0.2, weights="random"),
    )
    lines = describe_deployment(cfg, device="cuda", baseline="std-serving", url="http://127.0.0.1:8000/v1")
    assert lines == [
        "models: qwen3-0.6b on GPU [0], qwen3-32b on GPU [1]; placement mps",
        "policy: delayed thresholds [1, 4] table {4: [1, 3]}; autotune on",
        "router: r2r, learned with random weights, calibrated at start-up to hop rate 0.2",
        "baseline: std-serving (instead of the routed runtime)",
        "url: http://127.0.0.1:8000/v1",
    ]
    plain = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")])
    assert describe_deployment(plain, device="cpu") == [
        "models: tiny-small, tiny-large on cpu",
        "policy: delayed thresholds [1, 1] (default); autotune off",
        "router: r2r, synthetic, hop rate 0.1",
    ]


def test_check_config_prints_the_summary(tmp_path, capsys):
    from tokenrouter.core.config import DeploymentConfig, ModelConfig

    path = tmp_path / "serve.yaml"
    DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")]).save(path)
    with pytest.raises(SystemExit) as e:
        tr.main(["check-config", str(path)])
    assert int(e.value.code or 0) == 0
    out = capsys.readouterr().out
    assert "autotune off" in out and "router: r2r, synthetic, hop rate 0.1" in out


PAIR = ["serve", "--small", "tiny-small", "--large", "tiny-large", "--device", "cpu", "--dry-run"]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--autotune", "--baseline", "std-serving"], "--autotune re-tunes the routed runtime's B"),
        (["--kv-tokens", "-5"], "--kv-tokens must be >= 1, got -5"),
    ],
)
def test_serve_refuses_a_flag_it_would_drop(flags, needle, capsys):
    rc, _, err = _call(tr.main, [*PAIR, *flags], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"tr: error: {needle}"), err


def test_gpu_only_flags_on_cpu_are_named(capsys):
    rc, out, err = _call(tr.main, [*PAIR, "--sm-percent", "40,60", "--placement", "separate", "--gpus", "3,7"], capsys)
    assert rc == 0 and out.startswith("models:")
    assert "--sm-percent, --placement separate, --gpus only apply on GPUs: ignored with --device cpu" in err


def test_a_mistyped_model_is_unknown_not_missing_from_the_profile(capsys):
    rc, _, err = _call(trsim.main, ["run", "--small", "qwen3-06b", "--num-requests", "2"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "unknown model 'qwen3-06b'; did you mean 'qwen3-0.6b'?" in err and "tr models" in err
    assert "h200-analytic" not in err


def test_an_unmeasured_split_names_the_real_flag():
    from types import SimpleNamespace

    from tokenrouter.calibration.interference import ColocationError, split_of

    with pytest.raises(ColocationError, match=r"run `tr calibrate --sm-splits 40/60`"):
        split_of(SimpleNamespace(shares=[], model_a="a", model_b="b"), 40, 60)


def test_refit_takes_the_partials_own_plan(tmp_path, monkeypatch, capsys):
    """`tr calibrate -o OUT --refit`, as docs/calibration.md shows it: no --model, the partial says what it holds."""
    import json

    import tokenrouter.calibration.profiler.assemble as assemble_mod
    from tokenrouter.calibration import load_profile
    from tokenrouter.calibration.profiler.run import PARTIAL_FORMAT

    out = tmp_path / "h.json"
    partial = {"format": PARTIAL_FORMAT, "plan": {"models": ["tiny-small"]}, "results": {"model/tiny-small": {}}}
    (tmp_path / "h.json.partial.json").write_text(json.dumps(partial))
    seen = []
    monkeypatch.setattr(assemble_mod, "assemble", lambda p: seen.append(p) or load_profile("h200-analytic"))
    rc, _, err = _call(tr.main, ["calibrate", "-o", str(out), "--refit"], capsys)
    assert rc == 0, err
    assert seen == [partial] and load_profile(out).gpu.name == load_profile("h200-analytic").gpu.name
    rc, _, err = _call(tr.main, ["calibrate", "-o", str(tmp_path / "none.json"), "--refit"], capsys)
    assert rc == 2 and "--refit: cannot read" in err and len(err.strip().splitlines()) == 1


def test_piped_output_is_wider_than_80_columns(monkeypatch, capsys):
    import os

    monkeypatch.delenv("COLUMNS", raising=False)
    rc, out, _ = _call(trsim.main, ["run", "--workload", "fixed:16,8", "--num-requests", "4", "--thresholds", "1,1"],
                       capsys)  # fmt: skip
    widths = [len(line) for line in out.splitlines()]
    assert rc == 0 and 80 < max(widths) <= 120, widths
    assert "COLUMNS" not in os.environ


def test_no_doc_page_repeats_a_paragraph():
    import re
    from collections import Counter
    from pathlib import Path

    for page in sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md")):
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", page.read_text())]
        repeated = [p[:80] for p, n in Counter(p for p in paras if len(p) > 120).items() if n > 1]
        assert not repeated, (page.name, repeated)


def test_tune_help_reads_as_whole_sentences(capsys):
    rc, out, _ = _call(trsim.main, ["tune", "--help"], capsys)
    text = " ".join(out.replace("│", " ").split())
    assert (
        rc == 0
        and "each candidate is tuned where --objective compares it (docs/cli.md), and the best one is tuned at every N"
        in text
    )


def test_readme_says_what_the_random_router_is_calibrated_on():
    import inspect
    from pathlib import Path

    from tokenrouter.routers.learned.calibrate import calibrate_on_runner

    defaults = {k: p.default for k, p in inspect.signature(calibrate_on_runner).parameters.items()}
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"{defaults['num_prompts']} prompts of {defaults['prompt_len']} token ids" in readme
    assert "with short English text prompts" in readme


def test_docs_say_what_a_cpu_profile_is_good_for():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    calibration = " ".join((docs / "calibration.md").read_text().split())
    autotune = " ".join((docs / "autotune.md").read_text().split())
    assert "a check of the tool, not a profile of a CPU server" in calibration
    assert "Do not choose B with it (`trsim tune`)" in calibration
    assert "Autotune needs no profile" in autotune and "`tr calibrate --device cpu --quick`" in autotune
