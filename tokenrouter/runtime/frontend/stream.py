"""One request's view of the subservers' events: a reorder buffer that releases tokens in output order (they come
from any subserver, in any order); done once `Finished` arrived *and* every token below its `num_output` did."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.runtime import protocol as P


@dataclass(slots=True)
class Chunk:
    """Tokens released in order: `ids[k]` was written by model `models[k]` (`logprobs[k]`: None where none came)."""

    ids: list[int]
    models: list[int]
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)


@dataclass(slots=True)
class Outcome:
    """How a request ended. `status` is None for a normal finish, else the HTTP status of the error."""

    reason: str  # "stop" | "length" | "abort" | "error"
    num_output: int
    num_hops: int
    status: int | None = None
    message: str = ""


@dataclass(slots=True)
class RequestStream:
    """Filled by the ZeroMQ reader (`on_*`), drained by the HTTP handler (`next`). Invariants: released tokens are
    exactly positions 0..next_pos-1; the first writer of a position wins; nothing beyond `num_output` is released."""

    rid: str
    pending: dict[int, tuple[int, int, TokenLogprobs | None]] = field(default_factory=dict)  # pos -> (id, model, lp)
    next_pos: int = 0
    finished: P.Finished | None = None
    failure: Outcome | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def on_tokens(self, msg: P.Tokens) -> None:
        lps = msg.logprobs
        for k, tok in enumerate(P.unpack_ids(msg.ids)):
            pos = msg.pos + k
            if pos >= self.next_pos and pos not in self.pending:
                self.pending[pos] = (tok, msg.model, lps[k] if lps is not None and k < len(lps) else None)
        self.wake.set()

    def on_finished(self, msg: P.Finished) -> None:
        if self.finished is None and self.failure is None:
            self.finished = msg
        self.wake.set()

    def fail(self, status: int, message: str, reason: str = "error") -> None:
        """End the request with an error (rejected, subserver died, shutdown); wins over anything later."""
        if self.failure is None:
            self.failure = Outcome(reason, self.next_pos, 0, status, message)
        self.wake.set()

    def _take(self) -> Chunk | None:
        limit = self.finished.num_output if self.finished is not None else None
        chunk = Chunk([], [])
        while self.next_pos in self.pending and (limit is None or self.next_pos < limit):
            tok, model, lp = self.pending.pop(self.next_pos)
            chunk.ids.append(tok)
            chunk.models.append(model)
            chunk.logprobs.append(lp)
            self.next_pos += 1
        return chunk if chunk.ids else None

    def _outcome(self) -> Outcome | None:
        if self.failure is not None:
            return self.failure
        f = self.finished
        return Outcome(f.reason, f.num_output, f.num_hops) if f is not None and self.next_pos >= f.num_output else None

    async def next(self, tail_timeout_s: float = 5.0) -> Chunk | Outcome:
        """The next in-order chunk, or the outcome once everything is released; after `Finished`, missing tokens get
        `tail_timeout_s` to arrive, then the request ends with an error (never a hung client)."""
        while True:
            if self.failure is None:
                chunk = self._take()
                if chunk is not None:
                    return chunk
            out = self._outcome()
            if out is not None:
                return out
            self.wake.clear()
            if self.finished is None:
                await self.wake.wait()
                continue
            try:
                await asyncio.wait_for(self.wake.wait(), tail_timeout_s)
            except TimeoutError:
                missing = self.finished.num_output - self.next_pos
                self.fail(502, f"request finished but {missing} of its tokens never arrived")
