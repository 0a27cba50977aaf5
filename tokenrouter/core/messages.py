"""Messages between subservers (`PeerReq`, `LiveCount`) and the actions a scheduler asks its driver to carry out.

The scheduler never does I/O: `add()`, `resume()`, `abort()` and `complete()` return `Send`, `Emit` and
`Finish` actions and the driver (simpy process or runtime event loop) delivers them. A message is a value:
it shares no mutable object with the sender's state (`tokenrouter.core.wire` encodes it for the runtime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.core.request import SamplingParams


@dataclass(slots=True)
class PeerReq:
    """A request handed to a peer, or a control update.

    `tokens` is the suffix of the sequence the destination has not seen; it starts at position `loc`.
    On the first visit `loc == 0` and `tokens` is the whole sequence (prompt + output so far), and
    `prompt_len`/`sampling`/`seq` let the peer build its own `Request`. `finished` tells the peer to free
    the request's KV. `active`/`epoch` piggyback the system-wide number of live requests (see `LiveCount`).
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
    """Control message: the system-wide number of live (admitted, unfinished) requests.

    Only the entry subserver changes the count; it announces every admission and every finish to all peers
    with a strictly increasing `epoch`, and a receiver keeps the value of the highest epoch it has seen
    (messages may arrive late or out of order across links).
    """

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
    """Tokens committed to the client's output; `pos` is the output index of `tokens[0]`.

    `logprobs` is None unless the request asked for them (`SamplingParams.logprobs`); then it is aligned with
    `tokens`, each entry from the step of the model that wrote the token (None where that is unknown: a router
    committed a token other than the one the engine sampled and it is not among the top k).
    """

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
