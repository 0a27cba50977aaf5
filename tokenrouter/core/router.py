"""Router API: `route`, `send`, `receive`, one instance per subserver.

`route` is vectorized: it sees the whole step and returns one destination per row as an absolute model
index (equal to the local model index means stay). Hand-back semantics live in `keep_token`: whether the
token this model just sampled is committed when the row hops away (R2R/CITER/Co-LLM and R-Stitch drop it
so the peer regenerates that position; a router that hands back after the peer wrote its tokens keeps the
peer's token). `send`/`receive` convert between the local `Request` and the `PeerReq` on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import PeerReq
from tokenrouter.core.request import Request


class Router:
    """Base router: never hops. Subclasses override `route` (and `keep_token` for other semantics)."""

    name = "none"
    needs_logits = False
    needs_hidden = False

    def __init__(self, model: int = 0, num_models: int = 2) -> None:
        self.model = model
        self.num_models = num_models

    def bind(self, model: int, num_models: int) -> Router:
        """Attach this instance to one subserver; returns self for chaining."""
        self.model, self.num_models = model, num_models
        return self

    def route(self, batch: Batch, result: StepResult) -> Sequence[int]:
        """One destination model per row of `batch` (rows with `sample=False` are ignored)."""
        return [self.model] * len(batch.rows)

    def keep_token(self, req: Request, dst: int) -> bool:
        """Whether the token just sampled here is committed when the request hops to `dst`."""
        return False

    def send(self, req: Request, dst: int) -> PeerReq:
        """Build the message for `dst`: the suffix `dst` has not seen, plus extras."""
        loc = req.seen[dst]
        first = loc == 0
        return PeerReq(
            rid=req.rid,
            src=self.model,
            dst=dst,
            tokens=req.token_ids[loc:],
            loc=loc,
            prompt_len=req.prompt_len,
            seen=list(req.seen),
            sampling=req.sampling if first else None,
            eos_token_ids=req.eos_token_ids if first else (),
            num_hops=req.num_hops,
            extras=self.extras(req, dst),
        )

    def extras(self, req: Request, dst: int) -> dict[str, Any] | None:
        return None

    def receive(self, msg: PeerReq, req: Request) -> None:
        """Merge a returning request into the local one; default commits every returned token.

        Invariant: `msg.loc <= len(req.token_ids)`; tokens past `msg.loc` that the local copy holds were
        never committed (a dropped sample) and are replaced.
        """
        if msg.loc > len(req.token_ids):
            raise ValueError(f"{req.rid}: peer sent tokens from {msg.loc} but only {len(req.token_ids)} are known here")
        del req.token_ids[msg.loc :]
        req.token_ids.extend(msg.tokens)
        req.num_computed = min(req.num_computed, msg.loc)
        req.seen = list(msg.seen) if msg.seen else req.seen
        req.num_hops = max(req.num_hops, msg.num_hops)

    def on_finish(self, req: Request) -> None:
        """Drop per-request router state."""
