"""The co-run grid's passes: decode batches up to 64 tokens, peer-return passes above (calibration/profiler/corun)."""

from __future__ import annotations

import math

import pytest
from cuda_marks import cuda_only

from tokenrouter.calibration.profiler.corun import DecodeLoop, WindowSpec, engine_kwargs_for_corun, pass_rows


def test_a_grid_value_is_the_tokens_of_its_pass():
    assert pass_rows(1) == [1] and pass_rows(64) == [1] * 64
    # 200 tokens of returns: sixteen rows of 12 and one of 8
    assert pass_rows(200) == [12] * 16 + [8]


def test_engine_kwargs_hold_every_cell_and_graph_only_the_decode_batches():
    kw = engine_kwargs_for_corun("tiny-large", [1, 4, 200], context=32, device="cpu", page_size=16)
    assert kw["graph_buckets"] == (1, 4)
    assert kw["varlen_graphs"] and kw["varlen_graph_buckets"] == (200,)  # the return pass, in a graph of its size
    assert not engine_kwargs_for_corun("tiny-large", [1, 64], context=32, device="cpu")["varlen_graphs"]
    assert kw["max_num_batched_tokens"] == 200 and kw["max_batch_size"] == 17
    # one request set per value, each row 32 tokens = 2 pages (+1 spare each)
    assert kw["num_pages"] >= (1 + 4 + 17) * 2


def test_loop_runs_a_return_pass_over_its_rows_at_the_context():
    from tokenrouter.engine import Engine, EngineConfig

    kw = engine_kwargs_for_corun("tiny-large", [2, 100], context=32, device="cpu")
    eng = Engine(EngineConfig(**{**kw, "cuda_graphs": False}))
    try:
        loop = DecodeLoop(eng, [2, 100], 32)
        batch = loop.batches[100]
        assert [r.num_tokens for r in batch.rows] == [12] * 8 + [4]
        assert all(r.start + r.num_tokens == 32 for r in batch.rows)
        assert [r.num_tokens for r in loop.batches[2].rows] == [1, 1]
        import time

        # A window too short for one step (a loaded machine) gives no steps: the calibrator retries with a longer
        # one, and so does this test.
        for window_s in (0.6, 1.2, 2.4, 4.8, 9.6):
            t = time.monotonic()
            got = loop.run(WindowSpec(t, t + window_s, 100, settle_s=0.0, tail_s=0.0))
            if got["steps"]:
                break
            assert math.isnan(got["ms"])
        assert got["steps"] >= 1 and got["ms"] > 0
    finally:
        eng.close()


@pytest.mark.parametrize("value", [65, 512])
def test_values_above_decode_are_returns_of_that_many_tokens(value):
    rows = pass_rows(value)
    assert sum(rows) == value and max(rows) == 12 and len(rows) == -(-value // 12)


@cuda_only()
def test_on_cuda_a_return_pass_runs_in_its_varlen_graph_and_a_decode_batch_in_its_decode_graph():
    from tokenrouter.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(**engine_kwargs_for_corun("tiny-large", [4, 100], context=64, device="cuda")))
    try:
        loop = DecodeLoop(eng, [4, 100], 64)
        h = eng.step(loop.batches[100])
        h.result()
        assert h.varlen_bucket == 100 and h.graph_bucket is None
        h = eng.step(loop.batches[4])
        h.result()
        assert h.graph_bucket == 4
    finally:
        eng.close()
