"""`Counters.busy_ms` is the length of the union of the steps' [launch, done] intervals: overlapped steps count
once, gaps not at all, so busy time never exceeds wall time (the bench's busy fraction <= 100%)."""

from __future__ import annotations

import pytest

from tokenrouter.runtime.stats import Counters


def test_busy_is_the_union_of_overlapping_step_intervals():
    c = Counters()
    # launch order = completion order, as one model's in-flight queue runs them; overlap keeps two in flight
    steps = [(0.0, 2.0), (1.0, 3.0), (2.5, 4.0), (5.0, 6.0), (5.5, 5.75), (7.0, 7.5)]
    for launch, done in steps:
        c.step(4, launch, done)
    # by hand: [0, 4] + [5, 6] + [7, 7.5] = 4 + 1 + 0.5 s; the sum of step times is 2 + 2 + 1.5 + 1 + 0.25 + 0.5
    assert c.busy_ms == pytest.approx(5500.0)
    assert c.step_ms == pytest.approx(7250.0)
    assert c.steps == 6 and c.rows == 24


def test_back_to_back_steps_without_overlap_add_up():
    c = Counters()
    for k in range(10):
        c.step(1, k * 1.0, k * 1.0 + 0.5)
    assert c.busy_ms == pytest.approx(c.step_ms) == pytest.approx(5000.0)
