"""`tr calibrate` end to end on CPU with the tiny pair (a check of the tool, not a profile): a deadline leaves a
partial that the same command resumes, the profile it writes loads and prices steps, and it records where it
came from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tokenrouter.calibration import load_profile
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.core.graph_rule import GraphRule

pytestmark = pytest.mark.runtime  # worker processes


def calibrate(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "calibrate", "-m", "tiny-small", "-m", "tiny-large",
           "--device", "cpu", "--quick", "--sm-splits", "100/100", "--routers", "r2r", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


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
    assert prof.versions["torch"].startswith("2.") and prof.command.startswith("tr calibrate")
    assert prof.runtime is not None and prof.runtime.ipc_ms > 0 and prof.runtime.gate_rtts_per_step["step-sync"] >= 1
    grid = prof.colocation[0]
    assert (grid.model_a, grid.model_b) == ("tiny-small", "tiny-large") and grid.shares[0].share_a == 100
    small = prof.models["tiny-small"]
    assert small.passes is not None and small.host is not None and "r2r" in small.routers
    # The measured points are priced about as they were measured by the fit the profile chose (CPU timings on a
    # shared machine have outliers that a fit may follow: a loose bound on the median ratio, which a wrong table,
    # unit or axis still breaks by orders of magnitude).
    cm = CostModel(prof, "separate", models=["tiny-small", "tiny-large"])
    ratios = []
    for p in small.passes.eager.points:
        stats = StepStats.one_pass(p.rows, p.tokens, p.extend_tokens, p.context_tokens, graph=False, graphs=False)
        ratios.append(cm.for_model(0).step_ms(stats) / p.ms)
    assert 1 / 3 < sorted(ratios)[len(ratios) // 2] < 3.0, ratios
    assert cm.for_model(0).step_ms(StepStats.uniform(2, 1, 32, GraphRule(enabled=False))) > 0
    # --refit writes the same profile again from the partial, without measuring.
    again = tmp_path / "again.json"
    (tmp_path / "again.json.partial.json").write_text((tmp_path / "tiny.json.partial.json").read_text())
    r = calibrate("-o", str(again), "--refit")
    assert r.returncode == 0, r.stderr
    assert load_profile(again).models == prof.models
