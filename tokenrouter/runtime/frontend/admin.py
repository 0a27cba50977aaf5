"""The admin endpoint: change the batching policy (and a synthetic router's hop rate) of a running server.

    POST /admin/policy   {"policy": "delayed", "thresholds": [1, 7], "hop_rate": 0.1}   (Bearer ADMIN_KEY)
    POST /admin/policy   {"hop_rate": 0.3}        only the hop rate; the policy in force stays
    GET  /admin/policy   the policy in force (and, with autotune, its state)

Why: a live sweep of thresholds or hop rates needs no restart per cell (a restart is a minute of graph capture on
a GPU), and the controller that re-tunes B while serving (autotune) uses the same path. Every subserver applies the
change between steps and acknowledges it before the endpoint answers, so the next request runs under it everywhere.
Disabled (404) unless the server was started with an admin key; the key is separate from the API key.
Synchronous policies (step-sync, model-sync) share a gate built at start: switching to or from them is refused
(409); so is a hop rate for a router that has none to change (learned routers calibrate theirs).

Every change, the operator's and autotune's, goes through one `PolicyState` (one lock, in order), so each starts
from the policy the previous one left and GET answers what is in force.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tokenrouter.core.config import PolicyConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.errors import APIError

Threshold = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]


class PolicyBody(BaseModel):
    """The deployment config's `policy` section, plus an optional hop rate for a synthetic router. Without
    `policy`, only `hop_rate` may be given: the policy in force stays."""

    model_config = ConfigDict(extra="forbid", strict=True)

    policy: Literal["step-sync", "model-sync", "eager", "delayed"] | None = None
    thresholds: list[Threshold] = []
    table: dict[str, list[Threshold]] = {}  # live N -> thresholds (JSON keys are strings: "8": [1, 7])
    max_wait_ms: Annotated[float, Field(ge=0)] | None = None
    hop_rate: Annotated[float, Field(ge=0, le=1)] | None = None


class PolicyState:
    """The policy in force as GET /admin/policy reports it (`current`, the admin body's shape), and the one path
    every change takes (`apply`, under `lock`). `version` counts applied changes, so a change computed from an
    older state (autotune's solve ran while an operator changed the policy) can tell it is stale.
    `listeners` are called with (new policy dict, source) after every applied change of the policy section (not
    after a hop rate alone)."""

    def __init__(self, backend: Any, initial: dict[str, Any]) -> None:
        self.backend = backend
        self.current: dict[str, Any] = dict(initial)
        self.lock = asyncio.Lock()
        self.version = 0
        self.listeners: list[Callable[[dict[str, Any], str], None]] = []

    async def apply(self, body: dict[str, Any], source: str = "admin") -> dict[str, Any]:
        """Send `body` (the admin body's fields; `policy` None: keep the policy in force, change the hop rate)
        to every subserver and wait for their acks; the policy now in force. Hold `lock` around it when the
        change depends on the state (`apply` does not take it: the caller decides what is atomic)."""
        if body.get("policy") is None:
            if not self.current.get("policy"):
                raise APIError(409, "the policy in force is unknown: give 'policy' with the hop rate", "policy")
            body = {**{k: self.current.get(k) for k in ("policy", "thresholds", "table", "max_wait_ms")},
                    "hop_rate": body.get("hop_rate")}  # fmt: skip
        table = {int(k): list(v) for k, v in (body.get("table") or {}).items()}
        msg = P.SetPolicy(0, body["policy"], list(body.get("thresholds") or []), table, body.get("max_wait_ms"),
                          body.get("hop_rate"))  # fmt: skip
        errors = await self.backend.set_policy(msg)
        if errors:
            raise APIError(409, "; ".join(errors), "policy")
        new = {"policy": body["policy"], "thresholds": list(body.get("thresholds") or []),
               "table": {str(k): list(v) for k, v in table.items()}, "max_wait_ms": body.get("max_wait_ms"),
               "hop_rate": body.get("hop_rate")}  # fmt: skip
        if new["hop_rate"] is None:  # not given: the router keeps its rate
            new["hop_rate"] = self.current.get("hop_rate")
        keys = ("policy", "thresholds", "table", "max_wait_ms")
        changed = any(new[k] != self.current.get(k) for k in keys)
        self.current = new
        self.version += 1
        if changed:  # a hop rate alone changes no policy
            for fn in self.listeners:
                fn(new, source)
        return new

    def policy_config(self) -> PolicyConfig | None:
        """The policy in force as a config section (None when unknown)."""
        c = self.current
        if not c.get("policy"):
            return None
        table = {int(k): list(v) for k, v in (c.get("table") or {}).items()}
        return PolicyConfig(c["policy"], list(c.get("thresholds") or []), table, c.get("max_wait_ms"))


def add_admin_routes(app: FastAPI, state: PolicyState, num_models: int, admin_key: str | None,
                     extra: Callable[[], dict[str, Any]] | None = None) -> None:  # fmt: skip
    """Mount /admin/policy on `app`. `state`: the policy in force and the path every change takes; `extra`: more
    for GET to answer (autotune's state)."""
    router = APIRouter()

    def authorize(request: Request) -> None:
        if admin_key is None:
            raise APIError(404, "the admin endpoint is disabled: start the server with --admin-key KEY")
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {admin_key}".encode()):
            raise APIError(401, "missing or invalid admin key (Authorization: Bearer KEY)", code="invalid_api_key")

    @router.get("/admin/policy")
    async def get_policy(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse({**state.current, **(extra() if extra is not None else {})})

    @router.post("/admin/policy")
    async def set_policy(body: PolicyBody, request: Request) -> JSONResponse:
        authorize(request)
        if body.policy is None:
            given = [k for k in ("thresholds", "table", "max_wait_ms") if k in body.model_fields_set]
            if given or body.hop_rate is None:
                raise APIError(400, "without 'policy' give only 'hop_rate' (the policy in force stays)", "policy")
        if body.max_wait_ms is not None and not math.isfinite(body.max_wait_ms):
            raise APIError(400, "max_wait_ms must be a finite number", "max_wait_ms")
        for what, b in [("thresholds", body.thresholds), *((f"table.{n}", b) for n, b in body.table.items())]:
            if b and len(b) != num_models:
                raise APIError(400, f"{what} needs one value per model ({num_models}), got {len(b)}", "thresholds")
        bad = [k for k in body.table if not (k.isdigit() and int(k) >= 1)]
        if bad:
            raise APIError(400, f"table keys are concurrencies N >= 1, got {bad[0]!r}", "table")
        if body.policy is not None:
            table = {int(k): list(v) for k, v in body.table.items()}
            try:
                PolicyConfig(body.policy, list(body.thresholds), table, body.max_wait_ms).build()
            except ValueError as e:
                raise APIError(400, str(e), "policy") from None
        async with state.lock:
            new = await state.apply(body.model_dump(), source="admin")
        return JSONResponse({"applied": new})

    app.include_router(router)
