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


def test_the_varlen_grid_identifies_the_context_slope_of_returns():
    """The H200 grid measures peer returns at a second, long context in the buckets returns fill. On a pass whose
    short rows pay more per context token than a prefill row does (their attention is another regime), the table
    then recovers the returns' slopes and prices a held-out return at 8k context; without those points rows and
    context move together in every small knot (returns at 1k a row), the row slope is lost and the 8k return is
    mispriced: how the 8,192-token cells' long-context returns came out far too cheap."""
    from tokenrouter.calibration.passes import PassFn
    from tokenrouter.calibration.profiler.pass_timing import LONG_CTX, Grid, row_tokens

    buckets = [16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048]
    grid = Grid.default([1, 2, 4, 8], buckets)

    def point(t: int, mix: str, c: int) -> PassPoint:
        rows = row_tokens(t, mix)
        ctx = sum(max(c, n) for n in rows)
        short = sum(max(c, n) for n in rows if n <= 16)
        ms = 18.0 + 0.01 * next(b for b in buckets if b >= t) + 0.15 * len(rows) + 4e-4 * short + 5e-5 * (ctx - short)
        return PassPoint(tokens=t, rows=len(rows), context_tokens=ctx, ms=ms)

    pts = [point(*v) for v in grid.varlen]
    held = [point(*v) for v in grid.varlen_held]
    long_held = [p for p, v in zip(held, grid.varlen_held, strict=True) if v[2] > LONG_CTX]
    assert any(c == LONG_CTX for _, _, c in grid.varlen) and long_held

    def long_error(t) -> float:
        f = PassFn.of(t)
        return max(abs(f(p.tokens, p.rows, p.context_tokens, 0) - p.ms) / p.ms for p in long_held)

    new = fit_passes(pts, held, round_up=True, knots=buckets)
    assert new.ctx_ms == pytest.approx(4e-4, rel=0.05) and new.row_ms == pytest.approx(0.15, rel=0.05)
    assert long_error(new) < 0.02
    old = fit_passes([p for p, v in zip(pts, grid.varlen, strict=True) if v[2] != LONG_CTX], held, round_up=True,
                     knots=buckets)  # fmt: skip
    assert old.row_ms == 0.0 and long_error(old) > 0.05
