"""`tr calibrate` end to end on CPU with the tiny pair (a check of the tool, not a profile): a deadline leaves a
partial that the same command resumes, the profile it writes loads and prices steps, and it records where it
came from."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from tokenrouter.calibration import load_profile
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.passes import PassFn
from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.runtime.parent_watch import term_when_parent_dies

pytestmark = pytest.mark.runtime  # worker processes


def calibrate(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "calibrate", "-m", "tiny-small", "-m", "tiny-large",
           "--device", "cpu", "--quick", "--sm-splits", "100/100", "--routers", "r2r", *args]  # fmt: skip
    # stopped with the test run, however it ends (a killed suite once left it measuring)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=term_when_parent_dies)


def test_calibrate_resumes_and_writes_a_profile_the_simulator_reads(tmp_path):
    out = tmp_path / "tiny.json"
    cut = calibrate("-o", str(out), "--deadline", "0")
    assert cut.returncode == 3, cut.stderr
    assert "run the same command again" in cut.stderr and not out.exists()
    partial = json.loads((tmp_path / "tiny.json.partial.json").read_text())
    assert "--deadline 0" in partial["command"] and partial["results"] == {}
    # Another plan on the same partial is refused, not mixed in.
    other = calibrate("-o", str(out), "--max-tokens", "1024")
    assert other.returncode == 2 and "another plan" in other.stderr
    done = calibrate("-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    prof = load_profile(out)
    assert prof.kind == "measured" and set(prof.models) == {"tiny-small", "tiny-large"}
    assert prof.made_on_cpu and "it checks the tool, not a GPU's speed" in " ".join(done.stdout.split())
    assert prof.versions["torch"].startswith("2.") and prof.command.startswith("tr calibrate")
    assert prof.runtime is not None and prof.runtime.ipc_ms > 0 and prof.runtime.gate_rtts_per_step["step-sync"] >= 1
    grid = prof.colocation[0]
    assert (grid.model_a, grid.model_b) == ("tiny-small", "tiny-large") and grid.shares[0].share_a == 100
    # Standard serving's per-hop host cost is measured on this machine (its prefix cache), not borrowed.
    env = json.loads((tmp_path / "tiny.json.partial.json").read_text())["env"]
    assert msgspec.structs.asdict(prof.std_serving) == env["std_serving"]
    assert "std_serving" not in prof.notes["not_measured"]
    small = prof.models["tiny-small"]
    assert small.passes is not None and small.host is not None and "r2r" in small.routers
    # The pair was served for real under step-sync: the small model's host line is its gaps there.
    served = json.loads((tmp_path / "tiny.json.partial.json").read_text())["results"]["serving/tiny-small|tiny-large"]
    gaps = served["gaps"]["tiny-small"]
    assert served["complete"] and gaps and all(g["gap_ms"] > 0 for g in gaps)
    assert small.host.c0_ms + small.host.row_ms * gaps[0]["rows"] > 0
    # The cost model prices an eager pass from the profile's eager table, on its axes (rows, tokens, context,
    # extend): exactly the table's own function. Against the measured points only the unit is checked (CPU timings
    # on a loaded machine scatter by a few times, a wrong unit by a thousand): the fit itself is tested on
    # synthetic points (tests/calibration).
    cm = CostModel(prof, "separate", models=["tiny-small", "tiny-large"])
    table = PassFn.of(small.passes.eager)
    ratios = []
    for p in small.passes.eager.points:
        stats = StepStats.one_pass(p.rows, p.tokens, p.extend_tokens, p.context_tokens, graph=False, graphs=False)
        priced = cm.for_model(0).step_ms(stats)
        assert priced == pytest.approx(table(p.tokens, p.rows, p.context_tokens, p.extend_tokens)), p
        ratios.append(priced / p.ms)
    assert 1 / 30 < sorted(ratios)[len(ratios) // 2] < 30, ratios
    assert cm.for_model(0).step_ms(StepStats.uniform(2, 1, 32, GraphRule(enabled=False))) > 0
    # --refit writes the same profile again from the partial, without measuring.
    again = tmp_path / "again.json"
    (tmp_path / "again.json.partial.json").write_text((tmp_path / "tiny.json.partial.json").read_text())
    r = calibrate("-o", str(again), "--refit")
    assert r.returncode == 0, r.stderr
    assert load_profile(again).models == prof.models


def test_on_cpu_the_pair_is_measured_at_one_split(tmp_path):
    """A CPU has no SM shares: the co-run is measured once (100/100), not again at every default split (the plan a
    cut run records says so); splits asked for are still measured."""
    base = ["-m", "tiny-small", "-m", "tiny-large", "--device", "cpu", "--quick", "--deadline", "0"]
    for given, splits in (([], [[100, 100]]), (["--sm-splits", "100/100,40/60"], [[100, 100], [40, 60]])):
        out = tmp_path / f"p{len(given)}.json"
        cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "calibrate", *base, *given, "-o", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=term_when_parent_dies)
        assert p.returncode == 3, p.stderr  # cut by the deadline before any task: the plan is in the partial
        assert json.loads((tmp_path / f"{out.name}.partial.json").read_text())["plan"]["splits"] == splits


def test_ctrl_c_keeps_what_was_measured_and_is_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of a task: the points it measured are in the partial (the same command resumes from
    them) and the command ends in one line, exit 130."""
    from tokenrouter.calibration.profiler.run import Calibration
    from tokenrouter.cli.tr import main_tokenrouter

    def cut(self, task: str, model: str) -> None:
        self.partial["results"].setdefault(task, {"points": {}})["points"]["decode/1x16"] = {"ms": 1.0}
        raise KeyboardInterrupt

    monkeypatch.setattr(Calibration, "_model", cut)
    out = tmp_path / "c.json"
    with pytest.raises(SystemExit) as e:
        main_tokenrouter(["calibrate", "-m", "tiny-small", "--device", "cpu", "--quick", "-o", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 130
    assert err.strip().splitlines() == [f"tokenrouter: error: interrupted; what was measured is in {out}.partial.json: "
                                        "run the same command again to resume"]  # fmt: skip
    partial = json.loads((tmp_path / "c.json.partial.json").read_text())
    assert partial["results"]["model/tiny-small"]["points"] == {"decode/1x16": {"ms": 1.0}}
