"""The FastAPI app: OpenAI routes, `/v1/models`, `/health`, `/metrics`, errors in OpenAI's shape.

`create_app` builds everything per app (backend sockets, metrics registry) and starts/stops the backend in
the app's lifespan, so an app can be created, served and torn down repeatedly in one process.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError, StarletteHTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tokenrouter.runtime.frontend import access, generate, params
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.errors import APIError, error_response
from tokenrouter.runtime.frontend.handle import ServerHandle
from tokenrouter.runtime.frontend.metrics import FrontendMetrics
from tokenrouter.runtime.frontend.schemas import ChatRequest, CompletionRequest

_OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def served_model_name(handle: ServerHandle) -> str:
    """The name clients use for the routed pair, e.g. `tiny-small+tiny-large`."""
    return "+".join(handle.model_names)


def create_app(
    server: ServerHandle, tokenizer, *, api_key: str | None = None, heartbeat_timeout_s: float = 10.0,
    access_log: bool = True,
) -> FastAPI:  # fmt: skip
    """`tokenizer` is a `TextTokenizer` (encode, decode, encode_chat, eos_token_ids). `access_log`: one line per
    request on the `tokenrouter.access` logger (`frontend.access`)."""
    backend = Backend(server, heartbeat_timeout_s=heartbeat_timeout_s, access_log=access_log)
    metrics = FrontendMetrics(backend)
    name = served_model_name(server)
    accepted = {name, *server.model_names}
    names = list(server.model_names)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="TokenRouter", version="0.1.0", lifespan=lifespan)
    app.state.backend, app.state.metrics = backend, metrics

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if api_key is not None and request.url.path not in _OPEN_PATHS:
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
                return error_response(
                    401, "missing or invalid API key (Authorization: Bearer KEY)", None, "invalid_api_key"
                )
        return await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        metrics.requests.labels("error").inc()
        access.record(access.Entry("-", e.status, "invalid", 0, 0, 0, 0.0, e.message), backend.access_log)
        return error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = first.get("msg", "invalid request")
        access.record(access.Entry("-", 400, "invalid", 0, 0, 0, 0.0, msg), backend.access_log)
        return error_response(400, f"{'.'.join(loc) + ': ' if loc else ''}{msg}", ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail))

    def limits() -> params.Limits:
        return params.Limits(server.vocab_size, backend.kv_capacity_tokens, server.max_context_len)

    def check_model(model: str | None) -> str:
        if model is not None and model not in accepted:
            raise APIError(
                404, f"the model {model!r} does not exist; this server serves {name!r}", "model", "model_not_found"
            )
        return model or name

    async def answer(job: generate.Job, request: Request):
        metrics.in_flight.inc()
        try:
            resp = await generate.run(job, backend, tokenizer.decode, names, request)
        finally:
            metrics.in_flight.dec()
        metrics.requests.labels("ok" if resp.status_code == 200 else "error").inc()
        return resp

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        model = check_model(body.model)
        ids = params.completion_prompt(body, tokenizer.encode)
        sp = params.sampling(body, ids, limits(), default_max=16)
        job = generate.Job(ids, sp, tuple(tokenizer.eos_token_ids), model, chat=False, stream=body.stream)
        return await answer(job, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        model = check_model(body.model)
        ids = params.chat_prompt(body, tokenizer)
        sp = params.sampling(body, ids, limits(), default_max=None)
        job = generate.Job(ids, sp, tuple(tokenizer.eos_token_ids), model, chat=True, stream=body.stream)
        return await answer(job, request)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "tokenrouter"}
        card["max_model_len"] = server.max_context_len
        card["tokenrouter"] = {"models": names, "entry": server.entry}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> JSONResponse:
        if backend.draining:  # load balancers take the server out while it drains
            return JSONResponse({"status": "shutting down"}, status_code=503)
        bad = backend.unhealthy()
        if bad:
            return JSONResponse({"status": "unhealthy", "models": bad}, status_code=503)
        return JSONResponse({"status": "ok", "models": {n: "ok" for n in names}})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
