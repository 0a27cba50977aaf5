"""The admin endpoint: change the batching policy (and a synthetic router's hop rate) of a running server.

    POST /admin/policy   {"policy": "delayed", "thresholds": [1, 7], "hop_rate": 0.1}   (Bearer ADMIN_KEY)
    GET  /admin/policy   the policy in force

Why: a live sweep of thresholds or hop rates needs no restart per cell (a restart is a minute of graph capture on
a GPU), and a controller that re-tunes B while serving uses the same path. Every subserver applies the change
between steps and acknowledges it before the endpoint answers, so the next request runs under it everywhere.
Disabled (404) unless the server was started with an admin key; the key is separate from the API key.
Synchronous policies (step-sync, model-sync) share a gate built at start: switching to or from them is refused
(409); so is a hop rate for a router that has none to change (learned routers calibrate theirs).
"""

from __future__ import annotations

import hmac
import math
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tokenrouter.core.config import PolicyConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.errors import APIError

Threshold = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]


class PolicyBody(BaseModel):
    """The deployment config's `policy` section, plus an optional hop rate for a synthetic router."""

    model_config = ConfigDict(extra="forbid", strict=True)

    policy: Literal["step-sync", "model-sync", "eager", "delayed"]
    thresholds: list[Threshold] = []
    table: dict[str, list[Threshold]] = {}  # live N -> thresholds (JSON keys are strings: "8": [1, 7])
    max_wait_ms: Annotated[float, Field(ge=0)] | None = None
    hop_rate: Annotated[float, Field(ge=0, le=1)] | None = None


def add_admin_routes(app: FastAPI, backend: Any, num_models: int, admin_key: str | None,
                     initial: dict[str, Any]) -> None:  # fmt: skip
    """Mount /admin/policy on `app`. `initial`: the policy the server started with (GET answers it until a
    change)."""
    router = APIRouter()
    state = {"policy": dict(initial)}

    def authorize(request: Request) -> None:
        if admin_key is None:
            raise APIError(404, "the admin endpoint is disabled: start the server with --admin-key KEY")
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {admin_key}".encode()):
            raise APIError(401, "missing or invalid admin key (Authorization: Bearer KEY)", code="invalid_api_key")

    @router.get("/admin/policy")
    async def get_policy(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(state["policy"])

    @router.post("/admin/policy")
    async def set_policy(body: PolicyBody, request: Request) -> JSONResponse:
        authorize(request)
        if body.max_wait_ms is not None and not math.isfinite(body.max_wait_ms):
            raise APIError(400, "max_wait_ms must be a finite number", "max_wait_ms")
        for what, b in [("thresholds", body.thresholds), *((f"table.{n}", b) for n, b in body.table.items())]:
            if b and len(b) != num_models:
                raise APIError(400, f"{what} needs one value per model ({num_models}), got {len(b)}", "thresholds")
        bad = [k for k in body.table if not (k.isdigit() and int(k) >= 1)]
        if bad:
            raise APIError(400, f"table keys are concurrencies N >= 1, got {bad[0]!r}", "table")
        table = {int(k): list(v) for k, v in body.table.items()}
        try:
            PolicyConfig(body.policy, list(body.thresholds), table, body.max_wait_ms).build()
        except ValueError as e:
            raise APIError(400, str(e), "policy") from None
        msg = P.SetPolicy(0, body.policy, list(body.thresholds), table, body.max_wait_ms, body.hop_rate)
        errors = await backend.set_policy(msg)
        if errors:
            raise APIError(409, "; ".join(errors), "policy")
        new = body.model_dump()
        if new["hop_rate"] is None:  # not given: the router keeps its rate
            new["hop_rate"] = state["policy"].get("hop_rate")
        state["policy"] = new
        return JSONResponse({"applied": new})

    app.include_router(router)
