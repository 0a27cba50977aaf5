"""Shapes of the varlen CUDA graphs: the varlen pass of a step (prefill chunks, long returns, and the decode rows
beside them) captured over token buckets (docs/engine.md, What runs in CUDA graphs).

A bucket of T tokens has two row groups of fixed row counts: `long_rows` rows of any length (attention with
`max_q_len = T`) and `short_rows` rows of at most `short_q` tokens (`max_q_len = short_q`). Why two: the extend
attention's grid is rows x KV heads x query blocks of `max_q_len`, so one group at T would launch mostly empty
programs. Both launches write one output, each only its own rows' tokens.

Row placement (`VarlenShape.place`): long rows fill the long group in batch order; short rows fill the short
group, then any long-group room left. Padding (as in `inputs`) reads and writes only the null page and slot.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tokenrouter.engine.inputs import ALIGN, Layout

DEFAULT_LONG_ROWS = 8  # rows of any length per varlen graph (a multiple of ALIGN: group views stay aligned)
DEFAULT_SHORT_Q = 16  # longest row of the short group


def default_buckets(max_tokens: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest`, with the midpoint 1.5x between neighbours from 24 up, up to and including
    `max_tokens`: a step pads by less than half of its tokens (powers of two alone nearly double a 520-token
    step, and compute-bound models pay padding in full: docs/engine.md, Measured choices)."""
    out, b = [], smallest
    while b < max_tokens:
        out.append(b)
        if b >= 16 and b * 3 // 2 < max_tokens:
            out.append(b * 3 // 2)
        b *= 2
    out.append(max_tokens)
    return tuple(sorted(set(out)))


def max_pad_tokens(num_params: int, num_layers: int, *, tflops: float = 790.0, efficiency: float = 0.8,
                   launch_ms_per_layer: float = 0.25) -> int:  # fmt: skip
    """How many padding tokens a varlen graph may carry before an eager pass of the real tokens is cheaper: a padded
    token costs about 2 * params FLOPs (defaults: H200 bf16 peak), an eager pass its Python launch overhead, about
    `launch_ms_per_layer` per layer (docs/engine.md, Measured choices).
    """
    per_token_ms = 2.0 * num_params / (tflops * 1e12 * efficiency) * 1e3
    return int(launch_ms_per_layer * num_layers / max(per_token_ms, 1e-12))


@dataclass(frozen=True, slots=True)
class VarlenShape:
    tokens: int  # T: the bucket
    long_rows: int
    short_rows: int
    short_q: int
    page_size: int

    @property
    def rows(self) -> int:
        return self.long_rows + self.short_rows

    @property
    def layout(self) -> Layout:
        # Page writes: a row of q tokens enters at most ceil(q / page) + 1 new pages; slot rewrites beyond
        # this capacity go in a separate scatter before the replay (as for the decode graphs).
        upd = -(-self.tokens // self.page_size) + self.rows + 8
        return Layout(self.tokens, self.rows, self.rows, upd, varlen=True)

    def place(self, ntok: list[int]) -> list[int] | None:
        """Row order for the packed layout, or None when the rows do not fit: entry j is the index into `ntok`
        of attention row j (long group = rows 0..long_rows-1), -1 for a padding row inside the long group;
        padding rows after the list's end fill the short group."""
        long = [i for i, n in enumerate(ntok) if n > self.short_q]
        short = [i for i, n in enumerate(ntok) if n <= self.short_q]
        if len(long) > self.long_rows or len(ntok) > self.rows or sum(ntok) > self.tokens:
            return None
        room = self.long_rows - len(long)
        # Short rows that overflow the short group take the long group's free rows (placed right after the
        # long rows, so the long group stays one contiguous prefix).
        spill = max(0, len(short) - self.short_rows)
        if spill > room:
            return None
        return long + short[:spill] + [-1] * (room - spill) + short[spill:]


@dataclass(frozen=True, slots=True)
class VarlenShapes:
    """The varlen graph buckets of one engine."""

    shapes: tuple[VarlenShape, ...]
    max_pad: int | None = None  # padding tokens beyond which a step runs eagerly instead (None: no limit)

    @classmethod
    def build(cls, buckets: tuple[int, ...], *, max_rows: int, long_rows: int, short_q: int,
              page_size: int, max_pad: int | None = None) -> VarlenShapes:  # fmt: skip
        if long_rows < 1 or long_rows % ALIGN:
            raise ValueError(f"varlen long_rows must be a positive multiple of {ALIGN}, got {long_rows}")
        out = []
        for t in sorted(set(buckets)):
            short = -(-min(max_rows, t) // ALIGN) * ALIGN
            out.append(VarlenShape(t, long_rows, short, min(short_q, t), page_size))
        return cls(tuple(out), max_pad)

    @property
    def buckets(self) -> list[int]:
        return [s.tokens for s in self.shapes]

    def fit(self, ntok: list[int]) -> tuple[VarlenShape, list[int]] | None:
        """The smallest shape that holds rows of `ntok` tokens, and the row order (see `VarlenShape.place`);
        None when none holds them or the padding would exceed `max_pad` (then the step runs eagerly)."""
        total = sum(ntok)
        i = bisect.bisect_left(self.buckets, total)
        for shape in self.shapes[i:]:
            if self.max_pad is not None and shape.tokens - total > self.max_pad:
                return None
            order = shape.place(ntok)
            if order is not None:
                return shape, order
        return None
