"""The one rule for which rows of a step run inside a CUDA graph (docs/core.md, "The graph rule"), shared by the
scheduler, the cost model and the engine, so a row the graph cannot take never drags the batch off it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

# Token buckets captured as CUDA graphs. A decode row counts one token, a short extend row (a peer return)
# its tokens; a graph part runs in the smallest bucket that holds all its tokens.
DEFAULT_GRAPH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
# Rows up to this many tokens run inside the graphs; the engine measured 4- and 8-token extend rows at
# close to decode cost (studies/engine).
DEFAULT_GRAPH_MAX_ROW_TOKENS = 8


@dataclass(frozen=True, slots=True)
class GraphRule:
    """Which rows of a step run in a graph; the graph part's tokens never exceed `max_tokens`. `allow_split=False`
    keeps a step on one path (each part of a split step streams the weights, so one pass is cheaper)."""

    enabled: bool = True
    buckets: tuple[int, ...] = DEFAULT_GRAPH_BUCKETS
    max_row_tokens: int = DEFAULT_GRAPH_MAX_ROW_TOKENS
    allow_split: bool = False
    _row_limit: int = field(init=False, repr=False, compare=False, default=0)  # longest row a graph takes

    def __post_init__(self) -> None:
        b = tuple(sorted({int(x) for x in self.buckets}))
        if any(x < 1 for x in b):
            raise ValueError(f"graph buckets must be >= 1, got {self.buckets}")
        if self.max_row_tokens < 1:
            raise ValueError(f"graph max_row_tokens must be >= 1, got {self.max_row_tokens}")
        object.__setattr__(self, "buckets", b)
        object.__setattr__(self, "_row_limit", min(self.max_row_tokens, b[-1]) if self.enabled and b else 0)

    @property
    def max_tokens(self) -> int:
        """Tokens the graph part of one step can hold (0 when graphs are off)."""
        return self.buckets[-1] if self.enabled and self.buckets else 0

    def row_fits(self, num_tokens: int) -> bool:
        """Whether a row of `num_tokens` tokens may run in a graph at all."""
        return 0 < num_tokens <= self._row_limit

    def bucket_for(self, num_tokens: int) -> int | None:
        """The smallest bucket holding `num_tokens` tokens, or None."""
        if not self.enabled or num_tokens < 1:
            return None
        i = bisect.bisect_left(self.buckets, num_tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def split(self, row_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """Row indices of the graph part and of the eager part (each in batch order)."""
        graph: list[int] = []
        eager: list[int] = []
        room = self.max_tokens
        for i, n in enumerate(row_tokens):
            if self.row_fits(n) and n <= room:
                graph.append(i)
                room -= n
            else:
                eager.append(i)
        if eager and not self.allow_split:
            return [], list(range(len(row_tokens)))
        return graph, eager
