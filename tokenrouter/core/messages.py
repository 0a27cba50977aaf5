"""Messages between subservers (`PeerReq`) and the actions a scheduler asks its driver to carry out.

The scheduler never does I/O: `complete()` returns `Send`, `Emit` and `Finish` actions and the driver
(simpy process or runtime event loop) delivers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.request import SamplingParams


@dataclass(slots=True)
class PeerReq:
    """A request handed to a peer, or a control update.

    `tokens` is the suffix of the sequence the destination has not seen; it starts at position `loc`.
    On the first visit `loc == 0` and `tokens` is the whole sequence (prompt + output so far), and
    `prompt_len`/`sampling` let the peer build its own `Request`. `finished` tells the peer to free the
    request's KV. `active`/`epoch` piggyback the system-wide number of live requests; only the entry
    subserver changes it, and receivers keep the value with the highest epoch.
    """

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
    active: int = -1
    epoch: int = -1
    extras: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        """Approximate wire size, for the cross-host link model."""
        return 64 + 4 * len(self.tokens) + 8 * len(self.seen)


@dataclass(slots=True)
class Send:
    peer: int
    msg: PeerReq


@dataclass(slots=True)
class Emit:
    """Tokens committed to the client's output; `pos` is the output index of `tokens[0]`."""

    rid: str
    tokens: list[int]
    pos: int
    model: int


@dataclass(slots=True)
class Finish:
    rid: str
    reason: str
    num_output: int
    num_hops: int = 0


Action = Send | Emit | Finish
