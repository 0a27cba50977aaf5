"""Evaluate measured pass tables (`measured.PassTable`) fast (the simulator prices ~1e5 steps a run): plain lists
and a bisect, a few hundred nanoseconds a call.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .measured import MeasuredPasses, PassTable


@dataclass(slots=True)
class PassFn:
    """One pass table as a function, `(tokens, rows, context, extend) -> ms`, with its `fit` (see `PassTable`)."""

    fit: str
    round_up: bool
    knots: list[int]
    knot_ms: list[float]
    ctx_ms: float
    row_ms: float
    ext_ms: float
    lin: tuple[float, float, float, float, float]  # c0, c_row, c_ctx, c_tok, c_ext

    @classmethod
    def of(cls, t: PassTable, fit: str | None = None) -> PassFn:
        lin = (t.linear_c0, t.linear_c_row, t.linear_c_ctx, t.linear_c_tok, t.linear_c_ext)
        return cls(fit or t.fit, t.round_up, list(t.knots), list(t.knot_ms), t.ctx_ms, t.row_ms, t.ext_ms, lin)

    def knot_time(self, tokens: int) -> float:
        """Time at `tokens` fed tokens and no context: the bucket's, or interpolated between knots."""
        ks, ms = self.knots, self.knot_ms
        i = bisect.bisect_left(ks, tokens)
        if i < len(ks) and (ks[i] == tokens or self.round_up):
            return ms[i]
        if len(ks) == 1:
            return ms[0] * tokens / ks[0] if i else ms[0]
        if i == 0:  # below the first knot: the first segment's line, not below zero
            i = 1
        elif i == len(ks):  # beyond the last knot: extend the last segment
            i = len(ks) - 1
        k0, k1, m0, m1 = ks[i - 1], ks[i], ms[i - 1], ms[i]
        return max(0.0, m0 + (m1 - m0) * (tokens - k0) / (k1 - k0))

    def __call__(self, tokens: int, rows: int, context: int, extend: int = 0) -> float:
        if self.fit == "linear":
            c0, cr, cc, ct, ce = self.lin
            return c0 + cr * rows + cc * context + ct * tokens + ce * extend
        return self.knot_time(tokens) + self.ctx_ms * context + self.row_ms * rows + self.ext_ms * extend

    def bucket(self, tokens: int) -> int | None:
        """The knot a captured graph runs `tokens` in (None past the last knot)."""
        i = bisect.bisect_left(self.knots, tokens)
        return self.knots[i] if i < len(self.knots) else None


@dataclass(slots=True)
class ModelPasses:
    """A model's three measured passes and the engine's rules for choosing among them."""

    decode: PassFn
    varlen: PassFn | None
    eager: PassFn
    max_row_tokens: int
    varlen_max_pad: int | None
    varlen_max_long_rows: int

    @classmethod
    def of(cls, p: MeasuredPasses) -> ModelPasses:
        return cls(PassFn.of(p.decode), PassFn.of(p.varlen) if p.varlen is not None else None, PassFn.of(p.eager),
                   p.max_row_tokens, p.varlen_max_pad, p.varlen_max_long_rows)  # fmt: skip

    def varlen_pass(self, tokens: int, rows: int, context: int, extend: int, long_rows: int, graphs: bool) -> float:
        """The step's varlen pass: in a varlen graph when one holds it within the padding budget, else eager (the
        engine's `VarlenShapes.fit`)."""
        v = self.varlen
        if graphs and v is not None and long_rows <= self.varlen_max_long_rows:
            b = v.bucket(tokens)
            if b is not None and (self.varlen_max_pad is None or b - tokens <= self.varlen_max_pad):
                return v(tokens, rows, context, extend)
        return self.eager(tokens, rows, context, extend)
