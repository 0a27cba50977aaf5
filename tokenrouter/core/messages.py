"""Messages between subservers (`PeerReq`, `LiveCount`) and the actions a scheduler asks its driver to carry out
(`Send`, `Emit`, `Finish`). A message is a value: it shares no mutable object with the sender's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.core.request import SamplingParams


@dataclass(slots=True)
class PeerReq:
    """A request handed to a peer, or its finish (`finished`: free its KV). `tokens`: the suffix the destination has
    not seen, from `loc` (all of it on a first visit); `active`/`epoch` piggyback the live count (`LiveCount`)."""

    rid: str
    src: int
    dst: int
    tokens: list[int] = field(default_factory=list)
    loc: int = 0
    prompt_len: int = 0
    seen: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    sampling: SamplingParams | None = None
    eos_token_ids: tuple[int, ...] = ()
    num_hops: int = 0
    seq: int = -1
    active: int = -1
    epoch: int = -1
    extras: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        """Approximate wire size, for the cross-host link model."""
        return 64 + 4 * len(self.tokens) + 8 * len(self.seen)


@dataclass(slots=True)
class LiveCount:
    """The system-wide number of live (admitted, unfinished) requests. Only the entry changes it, announcing each
    change with a strictly increasing `epoch`; a receiver keeps the highest epoch's (links may reorder)."""

    src: int
    dst: int
    active: int
    epoch: int

    @property
    def nbytes(self) -> int:
        return 32


PeerMsg = PeerReq | LiveCount


@dataclass(slots=True)
class Send:
    peer: int
    msg: PeerMsg


@dataclass(slots=True)
class Emit:
    """Tokens committed to the client's output; `pos` is the output index of `tokens[0]`. `logprobs` (when asked
    for) is aligned with `tokens`, from the step that wrote each (None where unknown)."""

    rid: str
    tokens: list[int]
    pos: int
    model: int
    logprobs: list[TokenLogprobs | None] | None = None


@dataclass(slots=True)
class Finish:
    rid: str
    reason: str
    num_output: int
    num_hops: int = 0


Action = Send | Emit | Finish
