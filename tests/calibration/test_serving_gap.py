"""The serving loop's gap (`calibration.profiler.serving_gap`) and how the profile's host line takes it."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.profiler.assemble import host_costs, serving_gaps
from tokenrouter.calibration.profiler.run import Plan
from tokenrouter.calibration.profiler.serving_gap import handoff_idle, own_gaps, summarize


def step(model: int, rows: int, submitted: float, done: float, gpu_ms: float = 0.0) -> dict:
    return {"model": model, "rows": rows, "submitted": submitted, "done": done, "gpu_ms": gpu_ms}


def test_a_gap_counts_only_after_the_models_own_completion_with_nothing_in_flight():
    steps = [
        step(0, 1, 0.000, 0.010),
        step(0, 1, 0.0105, 0.020, gpu_ms=9.0),  # 0.5 ms after its own completion; the GPU idle 1 ms of 10
        step(1, 1, 0.0212, 0.040),  # after model 0's completion (a hand-off): not a gap of its own
        step(1, 1, 0.0408, 0.050),  # 0.8 ms after its own: counted
        step(0, 2, 0.0500 + 0.0007, 0.060),  # after model 1's completion: not counted
        step(0, 2, 0.0590, 0.070),  # submitted before the previous step was done (overlap): not counted
        step(0, 2, 0.0702, 0.080),  # 0.2 ms after its own
    ]
    gaps = own_gaps(steps)
    assert gaps[0][1] == [(pytest.approx(0.5), pytest.approx(1.0))]
    assert gaps[0][2] == [(pytest.approx(0.2), None)]  # no GPU time: no idle time either
    assert gaps[1] == {1: [(pytest.approx(0.8), None)]}


def test_summarize_keeps_batch_sizes_seen_often_enough_and_takes_the_median():
    gaps = {
        0: {1: [(0.9, 1.2), (0.5, 1.0), (0.7, 1.1)], 8: [(2.0, None)]},
        1: {4: [(1.0, None), (3.0, None), (2.0, None)]},
    }
    out = summarize(gaps, ("s", "l"), min_steps=3)
    assert out == {"s": [{"rows": 1, "gap_ms": 0.7, "idle_ms": 1.1, "steps": 3}],
                   "l": [{"rows": 4, "gap_ms": 2.0, "steps": 3}]}  # fmt: skip


def test_the_host_line_without_overlap_comes_from_the_served_idle_time_less_the_round_trips():
    # The bare loop says 0.1 ms (0.05 of it inside the step); the server left the GPU idle 0.9 ms at one row, 1.6
    # at eight; 0.1 ms of round trips each.
    sync = {"rows": 1, "overlap": False, "loop_ms": 1.1, "gpu_ms": 1.0, "step_host_ms": 0.05}
    raw = {"host": {"1": sync, "o": {**sync, "overlap": True, "loop_ms": 1.05}}}
    served = [{"rows": 1, "gap_ms": 0.5, "idle_ms": 0.9, "steps": 50}, {"rows": 8, "gap_ms": 1.0, "idle_ms": 1.6,
                                                                         "steps": 50}]  # fmt: skip
    h = host_costs(raw, served, gate_ms=0.1)
    assert h is not None
    assert h.c0_ms == pytest.approx(0.7) and h.row_ms == pytest.approx(0.1)
    assert h.overlap_frac == pytest.approx(0.05)  # overlap still from the bare loop
    # Records without idle times: the gap to the hand-over plus the bare loop's time inside the step.
    old = host_costs(raw, [{"rows": 1, "gap_ms": 0.85, "steps": 50}], gate_ms=0.1)
    assert old is not None and old.c0_ms == pytest.approx(0.8)
    bare = host_costs(raw)
    assert bare is not None and bare.c0_ms == pytest.approx(0.1) and bare.row_ms == 0.0


def test_with_the_bare_loop_at_two_row_counts_the_slope_is_its_and_the_served_steps_set_the_level():
    # Bare loop: 0.1 ms of host time at one row, 0.17 at eight (0.01 ms a row). Served: 0.9 ms idle at one row over
    # 90 steps, 1.6 at eight over 10 (a slope of 0.1 between them, from few steps), 0.1 ms of round trips each.
    one = {"rows": 1, "overlap": False, "loop_ms": 1.1, "gpu_ms": 1.0, "step_host_ms": 0.05}
    raw = {"host": {"1": one, "8": {**one, "rows": 8, "loop_ms": 1.17}}}
    served = [{"rows": 1, "gap_ms": 0.5, "idle_ms": 0.9, "steps": 90}, {"rows": 8, "gap_ms": 1.0, "idle_ms": 1.6,
                                                                         "steps": 10}]  # fmt: skip
    h = host_costs(raw, served, gate_ms=0.1)
    assert h is not None and h.row_ms == pytest.approx(0.01)
    # level: (90 * (0.8 - 0.01) + 10 * (1.5 - 0.08)) / 100
    assert h.c0_ms == pytest.approx(0.853)


def test_serving_gaps_gathers_finished_tasks_only():
    res = {"serving/a|b": {"complete": True, "gaps": {"a": [{"rows": 1, "gap_ms": 1.0, "steps": 30}]}},
           "serving/a|c": {"gaps": {"a": [{"rows": 2, "gap_ms": 9.0, "steps": 30}]}},  # cut short
           "model/a": {"complete": True}}  # fmt: skip
    assert serving_gaps(res) == {"a": [{"rows": 1, "gap_ms": 1.0, "steps": 30}]}


def test_each_pair_gets_a_serving_task_after_the_models_and_before_the_runtime():
    plan = Plan(models=["s", "l"], pairs=[("s", "l")], device="cpu")
    tasks = plan.tasks()
    assert tasks[-2:] == ["serving/s|l", "runtime"]
    assert tasks.index("model/l") < tasks.index("serving/s|l")
    assert not [t for t in Plan(models=["s"], device="cpu").tasks() if t.startswith("serving/")]


def test_hand_offs_at_one_row_give_the_idle_time_before_the_peers_step():
    steps = [
        step(0, 1, 0.000, 0.001, gpu_ms=1.0),
        step(1, 1, 0.0015, 0.0225, gpu_ms=20.0),  # 21.5 ms after the small model's completion, 20 of them GPU
        step(0, 1, 0.0230, 0.0240, gpu_ms=0.8),  # back: 1.5 - 0.8 = 0.7 ms idle
        step(1, 4, 0.0245, 0.0400, gpu_ms=15.0),  # four rows: a round, not a hand-off
        step(0, 1, 0.0401, 0.0410, gpu_ms=0.0),  # no GPU time (CPU): nothing
    ]
    idle = handoff_idle(steps)
    assert idle == {1: [pytest.approx(1.5)], 0: [pytest.approx(0.7)]}
