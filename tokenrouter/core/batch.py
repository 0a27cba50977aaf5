"""What a subserver launches (`Batch`) and what the executor returns (`StepResult`).

The engine consumes a `Batch` directly: for each row it feeds `input_ids` at positions
`start .. start + num_tokens - 1`, writes their KV into the pages of `req.pages`, and samples one token
per row with `sample=True` (a partial prefill chunk has `sample=False`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.request import Request


@dataclass(slots=True)
class BatchRow:
    req: Request
    start: int
    num_tokens: int
    sample: bool = True
    version: int = 0
    # std-serving baseline: the row is a hop that arrived as a new request and re-matches its prefix.
    rematch: bool = False
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

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def num_extend_tokens(self) -> int:
        """Tokens fed by rows that are not plain decodes (prefills and peer returns)."""
        return sum(r.num_tokens for r in self.rows if r.num_tokens > 1)

    @property
    def context_tokens(self) -> int:
        return sum(r.context_len for r in self.rows)

    @property
    def num_rematch(self) -> int:
        return sum(1 for r in self.rows if r.rematch)

    @property
    def rematch_context_tokens(self) -> int:
        return sum(r.start for r in self.rows if r.rematch)


@dataclass(slots=True)
class StepResult:
    """Per-row outputs of one step, in batch row order.

    `next_token_ids` holds a token for every row (ignored for rows with `sample=False`). `logits`
    ([rows, vocab]) and `hidden` ([rows, hidden]) are present only when the router asked for them; they
    may be device tensors, so nothing here forces a host sync. `destinations` (one absolute model index per
    row) is set when the router's device part ran inside the step (`Router.device`).
    """

    next_token_ids: Sequence[int] | Any
    logits: Any | None = None
    hidden: Any | None = None
    destinations: Sequence[int] | Any | None = None
