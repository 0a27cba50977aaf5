"""Fit measured passes into `PassTable`s: "buckets" (one intercept per knot plus shared slopes) and "linear", both
non-negative least squares (no coefficient below zero); the one with the smaller held-out error is used.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import msgspec
import numpy as np
from scipy.optimize import nnls

from .measured import FitError, PassPoint, PassTable
from .passes import PassFn


def _knot(knots: Sequence[int], tokens: int) -> int:
    """The smallest knot >= `tokens` (the last knot past the end)."""
    return knots[min(bisect.bisect_left(knots, tokens), len(knots) - 1)]


def _error(fn: PassFn, pts: Sequence[PassPoint]) -> FitError:
    rel = [abs(fn(p.tokens, p.rows, p.context_tokens, p.extend_tokens) - p.ms) / p.ms for p in pts if p.ms > 0]
    if not rel:
        return FitError(median=0.0, max=0.0, points=0)
    return FitError(median=float(np.median(rel)), max=float(np.max(rel)), points=len(rel))


def fit_passes(points: Sequence[PassPoint], held_out: Sequence[PassPoint] = (), *, round_up: bool,
               knots: Sequence[int] | None = None) -> PassTable:  # fmt: skip
    """Fit `points` (measured passes of one kind). `round_up`: a captured graph (time of the smallest knot >= T);
    `knots`: the graph buckets (default: the measured token counts). The table's extend-token slope stays 0 (the
    line has one); without held-out points the errors are on the fitted ones (`points: 0`)."""
    if not points:
        raise ValueError("no measured points to fit")
    ks = sorted(set(knots if knots is not None else (p.tokens for p in points)))
    used = sorted({_knot(ks, p.tokens) for p in points})
    groups = [_knot(used, p.tokens) for p in points]
    # A slope is fitted only where the grid identifies it: some knot has points that differ in that variable
    # (else the knot intercepts absorb it, e.g. rows = tokens in every decode-graph point).
    slopes = [n for n in ("context_tokens", "rows") if _varies(points, groups, n)]
    a = np.asarray([[1.0 if g == u else 0.0 for u in used] + [float(getattr(p, n)) for n in slopes]
                    for p, g in zip(points, groups, strict=True)])  # fmt: skip
    b = np.asarray([p.ms for p in points], float)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)  # columns of very different size: scale for nnls
    coef, _ = nnls(a / scale, b)
    coef = coef / scale
    knot_ms = [float(c) for c in coef[: len(used)]]
    fitted = dict(zip(slopes, (float(c) for c in coef[len(used) :]), strict=True))
    ctx_ms, row_ms = (fitted.get(n, 0.0) for n in ("context_tokens", "rows"))

    lin_a = np.asarray([[1.0, p.rows, p.context_tokens, p.tokens, p.extend_tokens] for p in points], float)
    lscale = np.maximum(np.abs(lin_a).max(axis=0), 1e-12)
    lin, _ = nnls(lin_a / lscale, b)
    lin = lin / lscale

    table = PassTable(
        points=list(points), held_out=list(held_out), fit="buckets", round_up=round_up, knots=used,
        knot_ms=knot_ms, ctx_ms=ctx_ms, row_ms=row_ms, linear_c0=float(lin[0]),
        linear_c_row=float(lin[1]), linear_c_ctx=float(lin[2]), linear_c_tok=float(lin[3]),
        linear_c_ext=float(lin[4]),
    )  # fmt: skip
    check = list(held_out) or list(points)
    errors = {fit: _error(PassFn.of(table, fit), check) for fit in ("buckets", "linear")}
    if not held_out:
        errors = {k: FitError(median=v.median, max=v.max, points=0) for k, v in errors.items()}
    # The line has five coefficients: with fewer points than that it is not determined, only the table is.
    eligible = [f for f in errors if f == "buckets" or len(points) > 5]
    best = min(eligible, key=lambda f: (errors[f].median, errors[f].max))
    return msgspec.structs.replace(table, fit=best, errors=errors)


def _varies(points: Sequence[PassPoint], groups: Sequence[int], name: str) -> bool:
    seen: dict[int, set[int]] = {}
    for p, g in zip(points, groups, strict=True):
        seen.setdefault(g, set()).add(getattr(p, name))
    return any(len(v) > 1 for v in seen.values())
