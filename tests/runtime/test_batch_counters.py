"""`Counters.batches`: the step time per batch size autotune reads. Each step gets its own share of the model's
timeline, from when it was handed to the engine (or the previous step's end, if later) to its end, in the
bucket of its row count."""

from __future__ import annotations

import pytest

from tokenrouter.core.autotune_counters import batch_bucket
from tokenrouter.runtime.stats import Counters


def test_overlapped_steps_get_their_own_share_in_their_bucket():
    c = Counters()
    # (rows, launch, done); launch order = completion order; overlap keeps two in flight
    steps = [(2, 0.0, 2.0), (3, 1.0, 3.0), (3, 2.5, 4.0), (8, 5.0, 6.0), (20, 5.5, 5.75)]
    for rows, launch, done in steps:
        c.step(rows, launch, done)
    b = c.batches
    # by hand: 2 rows [0, 2] = 2 s; 3 rows (2, 3] + (3, 4] = 2 s over two steps; 8 rows [5, 6] = 1 s; the 20-row
    # step ended before the 8-row one: nothing of its own
    assert b.steps[batch_bucket(2)] == 1 and b.ms[batch_bucket(2)] == pytest.approx(2000.0)
    k3 = batch_bucket(3)
    assert b.steps[k3] == 2 and b.rows[k3] == 6 and b.ms[k3] == pytest.approx(2000.0)
    assert b.ms[batch_bucket(8)] == pytest.approx(1000.0) and b.ms[batch_bucket(20)] == 0.0
    assert sum(b.ms) == pytest.approx(c.busy_ms)  # submitted at launch: the same union


def test_time_counts_from_submission_where_the_engine_works_inside_step():
    """On CPU `engine.step` computes before it returns, so `launch` (taken after it) is the end of the work: the
    step's time starts at submission."""
    c = Counters()
    for k in range(4):
        t = k * 1.0
        c.step(5, launch=t + 0.4, done=t + 0.41, submitted=t)
    assert c.batches.ms[batch_bucket(5)] == pytest.approx(4 * 410.0)
    assert c.busy_ms == pytest.approx(4 * 10.0)  # the existing busy counter keeps its launch -> done meaning
