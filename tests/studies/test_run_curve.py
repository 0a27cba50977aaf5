"""studies/serving/curve/run_curve.py: the long cells ask every request for LONG_OUTPUT tokens (they once ran
low-effort capped at 8,192, whose outputs never pass 2,048), the short cells low-effort capped at 256."""

from __future__ import annotations

import pytest
from study_script import load_study

from tokenrouter.workloads import make_workload


@pytest.fixture(scope="module")
def mod():
    return load_study("studies/serving/curve/run_curve.py")


def test_long_cells_request_exactly_the_long_output(mod):
    workload, cap = mod.cell_workload(mod.LONG_OUTPUT, 1.0)
    specs = make_workload(workload, 32, max_output=cap)
    assert cap == 8192 and {s.output_len for s in specs} == {8192}
    assert {s.prompt_len for s in specs} == {mod.LONG_PROMPT}
    # what the cells before the fix asked: far from 8,192-token outputs
    old = make_workload("low-effort", 32, max_output=8192)
    assert max(s.output_len for s in old) <= 2048


def test_short_cells_and_the_cpu_scale(mod):
    assert mod.cell_workload(mod.SHORT_OUTPUT, 1.0) == ("low-effort", 256)
    assert mod.cell_workload(mod.LONG_OUTPUT, 0.05) == ("fixed:100,409", 409)
    assert mod.cell_workload(mod.SHORT_OUTPUT, 0.01) == ("low-effort", 8)


def test_step_timeline_reads_committed_logs_and_cuts_the_cell(tmp_path):
    """step_timeline.py: gzipped logs (as committed) read like plain ones; a cell keeps only the steps that ended
    in its window, over their own span (a bench's simulated tail after the live run is not idle time)."""
    import gzip
    import json

    tl_mod = load_study("studies/serving/curve/step_timeline.py")
    recs = [{"model": 0, "step": k, "rows": 2, "launch": float(k), "done": k + 0.5, "gpu_ms": 0.0, "tokens": 2,
             "ext_rows": 0, "ext_tokens": 0} for k in range(10)]  # fmt: skip
    (tmp_path / "steps0.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode()))
    logs = tl_mod.read_logs(tmp_path)
    assert [r["step"] for r in logs[0]] == list(range(10))
    tl = tl_mod.live_cell(logs, [2.2, 7.0])  # steps 2..6 end inside: span 2.0 .. 6.5
    m = tl.models[0]
    assert m.steps == 5 and tl.window_s == (2.0, 6.5)
    assert m.busy_share == pytest.approx(2.5 / 4.5) and tl.idle_share == pytest.approx(2.0 / 4.5)


def test_a_long_cell_the_kv_pool_cannot_hold_gives_no_ratio(mod):
    """The 2026-12-05 H100 case: 27,200 KV tokens a model hold 3 of 8 requests of 100 + 8,192 tokens, so the long
    cell measures the queue; its ratio is left out and the fit is said instead. A pool that holds all 8 keeps it."""
    caps = {"qwen3-0.6b": 181_466, "qwen3-32b": 27_200}
    assert mod.requests_that_fit(caps, mod.LONG_PROMPT, mod.LONG_OUTPUT) == 27_200 // 8_292 == 3
    assert mod.requests_that_fit({}, mod.LONG_PROMPT, mod.LONG_OUTPUT) is None

    def rows(fit):
        short = {"server": "routed", "N": 8, "max_output": mod.SHORT_OUTPUT, "output_throughput_tok_s": 1500.0}
        long = {"server": "routed", "N": 8, "max_output": mod.LONG_OUTPUT, "output_throughput_tok_s": 1200.0,
                "kv_requests_fit": fit}  # fmt: skip
        return [short, long]

    bound = mod.headline_keys(rows(3))
    assert "long_output_ratio" not in bound and bound["long_output_kv_requests_fit"] == 3
    for fit in (8, 21, None):  # holds them all, or a server whose card does not say
        keys = mod.headline_keys(rows(fit))
        assert keys["long_output_ratio"] == pytest.approx(0.8) and "long_output_kv_requests_fit" not in keys
