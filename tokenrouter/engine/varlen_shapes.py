"""Shapes of the varlen CUDA graphs (docs/engine.md, What runs in CUDA graphs): a bucket of T tokens has
`long_rows` rows of any length (attention with `max_q_len = T`) and `short_rows` rows of at most `short_q` tokens,
two attention launches into one output, so the extend grid does not launch mostly empty programs."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tokenrouter.engine.inputs import ALIGN, Layout

DEFAULT_LONG_ROWS = 8  # rows of any length per varlen graph (a multiple of ALIGN: group views stay aligned)
DEFAULT_SHORT_Q = 16  # longest row of the short group


def default_buckets(max_tokens: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest` and their 1.5x midpoints, up to `max_tokens` (docs/engine.md, Measured choices)."""
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
    """Padding tokens a varlen graph may carry before an eager pass is cheaper: a padded token costs ~2 * params
    FLOPs (defaults: H200 bf16 peak), an eager pass `launch_ms_per_layer` per layer (docs/engine.md)."""
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
        # A row of q tokens enters at most ceil(q / page) + 1 new pages; more go in a scatter before the replay.
        upd = -(-self.tokens // self.page_size) + self.rows + 8
        return Layout(self.tokens, self.rows, self.rows, upd, varlen=True)

    def place(self, ntok: list[int]) -> list[int] | None:
        """Row order, or None when the rows do not fit: entry j is the `ntok` index of attention row j (long group
        first), -1 a padding row inside the long group; padding after the list's end fills the short group. Long
        rows fill the long group in batch order; short rows the short group, then the long group's room."""
        long = [i for i, n in enumerate(ntok) if n > self.short_q]
        short = [i for i, n in enumerate(ntok) if n <= self.short_q]
        if len(long) > self.long_rows or len(ntok) > self.rows or sum(ntok) > self.tokens:
            return None
        room = self.long_rows - len(long)
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
