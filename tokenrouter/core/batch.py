"""What a subserver launches (`Batch`) and what the executor returns (`StepResult`). For each row the engine feeds
`input_ids` at positions `start .. start + num_tokens - 1`, writes their KV into `req.pages` and samples one token
when `sample` (a partial prefill chunk does not); `graph_rows` run in a CUDA graph, the rest in an eager pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.request import Request


@dataclass(slots=True)
class BatchRow:
    req: Request
    start: int
    num_tokens: int
    sample: bool = True
    version: int = 0
    # Overlap: the fed token is the one the previous in-flight step samples for this request; the
    # executor takes it from that step's device output instead of `input_ids`.
    from_prev: bool = False

    @property
    def input_ids(self) -> list[int]:
        """Tokens to feed; for a `from_prev` row the token is not known on the host yet."""
        return self.req.token_ids[self.start : self.start + self.num_tokens]

    @property
    def context_len(self) -> int:
        """Tokens attended to by the last fed token (KV length after this step)."""
        return self.start + self.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1


@dataclass(slots=True)
class Batch:
    model: int
    step_id: int
    rows: list[BatchRow] = field(default_factory=list)
    # Indices of the rows in the CUDA-graph part, as the scheduler split them with its GraphRule; None for a
    # batch built by hand (the executor then applies its own rule through `split`).
    graph_rows: list[int] | None = None

    def split(self, rule: GraphRule) -> tuple[list[int], list[int]]:
        """(graph part, eager part) row indices: the scheduler's split when it made one, else `rule`'s."""
        if self.graph_rows is None:
            return rule.split([r.num_tokens for r in self.rows])
        graph = set(self.graph_rows)
        return list(self.graph_rows), [i for i in range(len(self.rows)) if i not in graph]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def context_tokens(self) -> int:
        return sum(r.context_len for r in self.rows)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's log-probability and its row's `top` k (token id, logprob), descending, from the raw
    logits' log-softmax (temperature 1, before top-k/top-p). A value, so it can travel in `Emit` and over the wire."""

    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(slots=True)
class StepResult:
    """Per-row outputs of one step, in batch row order: a token per row (ignored where `sample=False`); `logits` and
    `hidden` when the router asked (maybe device tensors); `destinations` when its device part ran in the step."""

    next_token_ids: Sequence[int] | Any
    logits: Any | None = None
    hidden: Any | None = None
    destinations: Sequence[int] | Any | None = None
    # Batch row of each `logits`/`hidden` row; None: one per batch row, in order. Engines return the sampled
    # rows only (a prefill chunk that samples nothing has no logits row).
    logit_rows: Sequence[int] | None = None
    # One entry per batch row; None for rows that did not ask (`SamplingParams.logprobs`) or sampled nothing; the
    # field None when no row asked.
    logprobs: list[TokenLogprobs | None] | None = None
