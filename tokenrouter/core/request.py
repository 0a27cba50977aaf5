"""Request lifecycle as one subserver sees it (docs/core.md, "The driver contract"): `token_ids` is the sequence as
known here, `num_computed` how many leading tokens have KV in this pool. Status: WAITING -> RUNNING -> WAITING
(stays) or PENDING (a peer owns the next step; KV kept) -> WAITING (returned) ... -> FINISHED.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class ReqStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PENDING = 2
    FINISHED = 3


@dataclass(slots=True)
class SamplingParams:
    """Greedy when temperature == 0. `max_tokens` counts output tokens; `seed` makes sampling repeatable."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; k >= 0: the sampled token's log-probability and the top k (k <= 20)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(slots=True, eq=False)
class Request:
    rid: str
    token_ids: list[int]
    prompt_len: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    num_models: int = 2
    entry: int = 0
    eos_token_ids: tuple[int, ...] = ()
    num_computed: int = 0
    status: ReqStatus = ReqStatus.WAITING
    pages: list[int] = field(default_factory=list)
    # Admission order, given by the entry and carried to every peer: lower is older. KV victims are always younger
    # than the request that needs the pages, so no two requests can keep evicting each other.
    seq: int = -1
    # Bumped whenever the request leaves this subserver (hop, finish): rows of an already prepared batch
    # that carry an older version are stale and their results are ignored.
    version: int = 0
    # Rows of this request in batches launched here and not yet completed (2 when overlap has prepared a
    # `from_prev` row behind a running one). Only the last of them puts the request back in the queue.
    num_inflight: int = 0
    # seen[j]: how many leading tokens of the sequence model j knows. Travels with the request, so the
    # owner always knows which suffix a peer lacks, for any number of models.
    seen: list[int] = field(default_factory=list)
    num_hops: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    ready_since: float = 0.0
    # The synthetic router's key for this request's hop draws (`routers.synthetic.hop_key`), set on first use.
    hop_key: int | None = None
    # Router state only (what `Router.extras` sends and `Router.receive` reads); the scheduler keeps none here.
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seen:
            self.seen = [0] * self.num_models

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_new(self) -> int:
        """Tokens the next step must feed (1 for a plain decode)."""
        return len(self.token_ids) - self.num_computed

    def stop_reason(self) -> str | None:
        """Why the request is done after its last committed token, or None."""
        if self.num_output <= 0:
            return None
        tok = self.token_ids[-1]
        if tok in self.sampling.stop_token_ids:
            return "stop"
        if not self.sampling.ignore_eos and tok in self.eos_token_ids:
            return "stop"
        if self.num_output >= self.sampling.max_tokens:
            return "length"
        return None
