"""Router API, one instance per subserver (docs/core.md, "Router API"): `route` gives one absolute destination per
row of a step; `keep_token` whether the token just sampled is committed when the row hops; `send`/`receive`
convert a `Request` to and from the `PeerReq` on the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import PeerReq
from tokenrouter.core.request import Request


@runtime_checkable
class DeviceRouter(Protocol):
    """The part of a router that runs inside the engine's step (in its CUDA graph): sampled tokens (hidden states,
    logits when asked) -> one destination per row: no host sync, data-dependent shape or allocation outliving it."""

    needs_logits: bool
    needs_hidden: bool

    def __call__(self, token_ids: Any, hidden: Any | None, logits: Any | None) -> Any: ...


class Router:
    """Base router: never hops. Synthetic routers override `route` (on the host); a learned one sets `device`,
    whose output the engine returns as `StepResult.destinations` and the default `route` passes through."""

    name = "none"
    needs_logits = False
    needs_hidden = False
    device: DeviceRouter | None = None

    def __init__(self, model: int = 0, num_models: int = 2) -> None:
        self.model = model
        self.num_models = num_models

    def bind(self, model: int, num_models: int) -> Router:
        """Attach this instance to one subserver; returns self."""
        self.model, self.num_models = model, num_models
        return self

    def select_tokens(self, batch: Batch, result: StepResult) -> Sequence[int] | Any:
        """The token each row commits (or drops, per `keep_token`), asked before `route`: by default the one sampled;
        the ensemble's weighted choice (it may stash per-row state for `route`/`extras` of the same call)."""
        return result.next_token_ids

    def route(self, batch: Batch, result: StepResult) -> Sequence[int]:
        """One destination model per row of `batch` (rows with `sample=False` are ignored)."""
        if result.destinations is not None:
            return result.destinations
        return [self.model] * len(batch.rows)

    def keep_token(self, req: Request, dst: int) -> bool:
        """Whether the token just sampled here is committed when the request hops to `dst`."""
        return False

    def may_stay(self, req: Request) -> bool:
        """Whether the row of `req` running here may stay. Overlap prepares a row ahead only for such requests
        (R2R's large model hands back after every token: a row prepared for it is computed for nothing)."""
        return True

    def send(self, req: Request, dst: int) -> PeerReq:
        """Build the message for `dst`: the suffix `dst` has not seen, plus extras."""
        loc = req.seen[dst]
        first = loc == 0
        return PeerReq(rid=req.rid, src=self.model, dst=dst, tokens=req.token_ids[loc:], loc=loc,
                       prompt_len=req.prompt_len, seen=list(req.seen), sampling=req.sampling if first else None,
                       eos_token_ids=req.eos_token_ids if first else (), num_hops=req.num_hops,
                       extras=self.extras(req, dst))  # fmt: skip

    def extras(self, req: Request, dst: int) -> dict[str, Any] | None:
        return None

    def receive(self, msg: PeerReq, req: Request) -> None:
        """Merge an arriving request into the local one (every handover, the first visit included). Invariant:
        `msg.loc <= len(req.token_ids)`; local tokens past `msg.loc` were never committed and are replaced."""
        if msg.loc > len(req.token_ids):
            raise ValueError(f"{req.rid}: peer sent tokens from {msg.loc} but only {len(req.token_ids)} are known here")
        del req.token_ids[msg.loc :]
        req.token_ids.extend(msg.tokens)
        req.num_computed = min(req.num_computed, msg.loc)
        req.seen = list(msg.seen) if msg.seen else req.seen
        req.num_hops = max(req.num_hops, msg.num_hops)

    def on_finish(self, req: Request) -> None:
        """Drop per-request router state."""
