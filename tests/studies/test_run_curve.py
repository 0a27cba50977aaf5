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
