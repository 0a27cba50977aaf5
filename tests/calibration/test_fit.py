"""Fitting measured passes: the bucket table recovers a step function a graph produces (padding paid), the line
wins on data that is linear, and held-out points decide between them."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.fit import fit_passes
from tokenrouter.calibration.measured import PassPoint
from tokenrouter.calibration.passes import PassFn

BUCKETS = [1, 2, 4, 8, 16, 24, 32]
KNOT = {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1, 16: 1.3, 24: 1.45, 32: 1.6}


def graph_ms(tokens: int, rows: int, ctx: int) -> float:
    """A captured decode graph: the bucket's time (padding is computed too) + 0.2 us per context token."""
    bucket = next(b for b in BUCKETS if b >= tokens)
    return KNOT[bucket] + 2e-4 * ctx


def pt(tokens: int, ctx_per_row: int, fn=graph_ms) -> PassPoint:
    return PassPoint(tokens=tokens, rows=tokens, context_tokens=tokens * ctx_per_row,
                     ms=fn(tokens, tokens, tokens * ctx_per_row))  # fmt: skip


def test_bucket_table_recovers_a_graph_step_function():
    points = [pt(b, c) for b in BUCKETS for c in (256, 2048)]
    held = [pt(t, 1024) for t in (3, 12, 20, 30)]
    t = fit_passes(points, held, round_up=True, knots=BUCKETS)
    assert t.fit == "buckets"
    assert t.knots == BUCKETS and t.knot_ms == pytest.approx([KNOT[b] for b in BUCKETS], abs=1e-6)
    assert t.ctx_ms == pytest.approx(2e-4, rel=1e-4) and t.row_ms == 0.0  # rows = tokens here: not identified
    assert t.errors["buckets"].max < 1e-6 and t.errors["buckets"].points == 4
    assert t.errors["linear"].median > t.errors["buckets"].median
    f = PassFn.of(t)
    assert f(20, 20, 20 * 500) == pytest.approx(graph_ms(20, 20, 20 * 500))  # 20 tokens run in bucket 24


def test_linear_data_picks_the_line():
    def lin(tokens: int, rows: int, ctx: int) -> float:
        return 0.5 + 0.01 * tokens + 1e-4 * ctx

    points = [pt(b, c, lin) for b in BUCKETS for c in (256, 2048)]
    held = [pt(t, 1024, lin) for t in (3, 12, 20, 30)]
    t = fit_passes(points, held, round_up=True, knots=BUCKETS)
    assert t.fit == "linear" and t.errors["linear"].max < 1e-6
    assert PassFn.of(t)(20, 20, 20 * 1024) == pytest.approx(lin(20, 20, 20 * 1024), rel=1e-6)


def test_eager_table_interpolates_between_measured_tokens():
    def eager(tokens: int, rows: int, ctx: int) -> float:
        return 20.0 + 0.05 * tokens

    points = [pt(t, 0, eager) for t in (1, 64, 256, 1024)]
    t = fit_passes(points, [pt(512, 0, eager)], round_up=False)
    f = PassFn.of(t, "buckets")
    assert f(512, 512, 0) == pytest.approx(eager(512, 512, 0), rel=1e-6)  # between knots: interpolated
    assert f(2048, 2048, 0) == pytest.approx(eager(2048, 2048, 0), rel=1e-6)  # beyond: last segment extended


def test_rows_slope_is_fitted_where_the_grid_varies_rows():
    def varlen(tokens: int, rows: int, ctx: int) -> float:  # a varlen bucket + per-row attention/sampling cost
        bucket = next(b for b in (16, 32, 64) if b >= tokens)
        return {16: 2.0, 32: 2.5, 64: 3.5}[bucket] + 1e-4 * ctx + 0.01 * rows

    points = []
    for b in (16, 32, 64):  # two mixes per bucket: one long row, or returns of 4 tokens
        for rows, ctx in ((1, b), (b // 4, 1024 * b // 4)):
            points.append(PassPoint(tokens=b, rows=rows, context_tokens=ctx, extend_tokens=b,
                                    ms=varlen(b, rows, ctx)))  # fmt: skip
    t = fit_passes(points, round_up=True, knots=[16, 24, 32, 48, 64])
    assert t.knots == [16, 32, 64] and t.row_ms == pytest.approx(0.01, rel=1e-6)
    assert t.ctx_ms == pytest.approx(1e-4, rel=1e-6) and t.errors["buckets"].points == 0


def test_no_points_is_an_error():
    with pytest.raises(ValueError, match="no measured points"):
        fit_passes([], round_up=True)
