"""The admin endpoint (docs/openai-api.md, "Admin endpoint"). Every change, the operator's and autotune's, goes
through one `PolicyState` (one lock, in order); a refused body changes nothing, the pause included."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tokenrouter.core.config import DeploymentConfig, PolicyConfig
from tokenrouter.core.policy import PolicyKind
from tokenrouter.runtime.frontend.errors import APIError

Threshold = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]
Concurrency = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,8}$")]  # a live N >= 1, as a JSON key


class PolicyBody(BaseModel):
    """The config's `policy` section plus optional `hop_rate` and `autotune` (pause: false, resume: true); without
    `policy` the policy in force stays."""

    model_config = ConfigDict(extra="forbid", strict=True)

    policy: Literal["step-sync", "model-sync", "eager", "delayed"] | None = None
    thresholds: list[Threshold] = []
    table: dict[Concurrency, list[Threshold]] = {}  # live N -> thresholds (JSON keys are strings: "8": [1, 7])
    max_wait_ms: Annotated[float, Field(ge=0)] | None = None
    hop_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    autotune: bool | None = None  # strict: only JSON true/false (null: leave autotune as it is)

    def policy_config(self) -> PolicyConfig | None:
        """The policy section as the config's (None without `policy`); a 400 for what it cannot be."""
        if self.policy is None:
            given = [k for k in ("thresholds", "table", "max_wait_ms") if k in self.model_fields_set]
            if given or (self.hop_rate is None and self.autotune is None):
                raise APIError(400, "without 'policy' give only 'hop_rate' and/or 'autotune' (the policy in force "
                               "stays)", "policy")  # fmt: skip
            return None
        table = {int(k): list(v) for k, v in self.table.items()}
        try:
            return PolicyConfig(self.policy, list(self.thresholds), table, self.max_wait_ms)
        except ValueError as e:
            raise APIError(400, str(e), "policy") from None


class PolicyState:
    """The policy in force (None while unknown) and the one path every change takes (`apply`, under `lock`); `version`
    counts changes (a stale computation can tell); `listeners` get (policy, source) after each policy change."""

    def __init__(self, backend: Any, num_models: int, config: DeploymentConfig | None = None) -> None:
        self.backend, self.num_models = backend, num_models
        self.policy = None if config is None else replace(config.policy, autotune=None)
        self.hop_rate = None if config is None else config.router.hop_rate
        self.baseline = None if config is None else config.baseline  # a baseline server refuses every change
        self.lock = asyncio.Lock()
        self.version = 0
        self.listeners: list[Callable[[PolicyConfig, str], None]] = []

    def describe(self) -> dict[str, Any]:
        """The policy in force in the admin body's shape (GET /admin/policy); empty while unknown."""
        pc = self.policy
        if pc is None:
            return {}
        table = {str(n): list(b) for n, b in pc.table.items()}
        # delayed without thresholds runs B = 1 for every model (`PolicyConfig.nominal_thresholds`): say so
        flat = list(pc.thresholds) or ([1] * self.num_models if pc.kind is PolicyKind.DELAYED else [])
        return {"policy": str(self.baseline or pc.kind), "thresholds": flat, "table": table,
                "max_wait_ms": pc.max_wait_ms, "hop_rate": self.hop_rate}  # fmt: skip

    async def apply(self, policy: PolicyConfig | None, hop_rate: float | None = None,
                    source: str = "admin") -> dict[str, Any]:  # fmt: skip
        """Check `policy` (None: keep it), send it with `hop_rate` to every subserver, wait for their acks; the
        policy now in force. The caller holds `lock` when the change depends on the state."""
        if policy is None:
            if self.policy is None:
                raise APIError(409, "the policy in force is unknown: give 'policy' with the hop rate", "policy")
            policy = self.policy
        try:
            policy.check(self.num_models)
        except ValueError as e:
            raise APIError(400, str(e), "policy") from None
        errors = await self.backend.set_policy(policy, hop_rate)
        if errors:
            raise APIError(409, "; ".join(errors), "policy")
        changed = policy != self.policy
        self.policy = policy
        self.hop_rate = self.hop_rate if hop_rate is None else hop_rate
        self.version += 1
        if changed:  # a hop rate alone changes no policy
            for fn in self.listeners:
                fn(policy, source)
        return self.describe()


class Tuner(Protocol):
    """What the endpoint needs of autotune (`autotune_task.AutotuneTask`; a protocol: that module imports this one)."""

    def describe(self) -> dict[str, Any]: ...

    def switched(self, on: bool | None) -> AbstractContextManager[None]: ...


NO_AUTOTUNE = "this server runs without autotune: start it with --autotune"


def add_admin_routes(app: FastAPI, state: PolicyState, admin_key: str | None, tuner: Tuner | None = None) -> None:
    """Mount /admin/policy on `app`; `tuner`: the server's autotune (None without)."""
    router = APIRouter()

    def authorize(request: Request) -> None:
        if admin_key is None:
            raise APIError(404, "the admin endpoint is disabled: start the server with --admin-key KEY")
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {admin_key}".encode()):
            raise APIError(401, "missing or invalid admin key (Authorization: Bearer KEY)", code="invalid_api_key")

    def describe() -> dict[str, Any]:
        return {**state.describe(), **(tuner.describe() if tuner is not None else {})}

    @router.get("/admin/policy")
    async def get_policy(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(describe())

    @router.post("/admin/policy")
    async def set_policy(body: PolicyBody, request: Request) -> JSONResponse:
        authorize(request)
        if body.autotune is not None and tuner is None:  # refused whole: nothing else in the body applies either
            raise APIError(409, NO_AUTOTUNE, "autotune")
        policy = body.policy_config()
        async with state.lock:  # no autotune change lands between the pause and the change that comes with it
            with nullcontext() if tuner is None else tuner.switched(body.autotune):
                if policy is not None or body.hop_rate is not None:  # `autotune` alone sends nothing to subservers
                    await state.apply(policy, body.hop_rate, source="admin")
            return JSONResponse({"applied": describe()})  # under the lock: no autotune change after ours in it

    app.include_router(router)
