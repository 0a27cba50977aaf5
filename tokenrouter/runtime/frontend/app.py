"""The FastAPI app: OpenAI routes, `/v1/models`, `/health`, `/metrics`, errors in OpenAI's shape. `create_app`
builds everything per app, so apps in one process share nothing; the routes read `request.app.state`."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError, StarletteHTTPException
from fastapi.responses import JSONResponse, Response
from msgspec.structs import replace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenrouter.runtime.frontend import access, choices, generate, params
from tokenrouter.runtime.frontend.admin import PolicyState, add_admin_routes
from tokenrouter.runtime.frontend.autotune_task import AutotuneTask
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.errors import APIError, error_response
from tokenrouter.runtime.frontend.handle import ServerHandle
from tokenrouter.runtime.frontend.metrics import FrontendMetrics, PolicyCollector
from tokenrouter.runtime.frontend.schemas import ChatRequest, CompletionRequest

_OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
log = logging.getLogger("tokenrouter.frontend")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line for the first validation error and the parameter it names, without pydantic's union tags
    (`prompt.list[int].0` -> `prompt.0`); a value that matched no member of a union says so."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc, union = _param_path(first)
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    if union:  # a member whose type the value had but whose limit it broke says more than "no type fits"
        broken = [e for e in errors if _param_path(e)[0] == loc and not str(e.get("type", "")).endswith("_type")]
        msg = str(broken[0].get("msg", msg)) if broken else "has none of the accepted types"
    if first.get("type") == "json_invalid":
        return "the body is not valid JSON", None
    return (f"{param}: {msg}" if param else msg), param


def _param_path(error: dict) -> tuple[list[str], bool]:
    """The error's parameter path without "body" and pydantic's union member tags, and whether it had such tags."""
    raw = [x for x in error.get("loc", ()) if x != "body"]
    loc = [str(x) for x in raw if isinstance(x, int) or (_FIELD.fullmatch(str(x)) and x not in _TYPE_TAGS)]
    return loc, len(loc) < len(raw)


def served_model_name(handle: ServerHandle) -> str:
    """The name clients use for the routed pair, e.g. `tiny-small+tiny-large`."""
    return "+".join(handle.model_names)


def create_app(
    server: ServerHandle, tokenizer, *, api_key: str | None = None, heartbeat_timeout_s: float = 10.0,
    access_log: bool = True, admin_key: str | None = None,
) -> FastAPI:  # fmt: skip
    """`tokenizer` is a `TextTokenizer`; `access_log`: one line per request (`frontend.access`)."""
    backend = Backend(server, heartbeat_timeout_s=heartbeat_timeout_s, access_log=access_log)
    metrics = FrontendMetrics(backend)
    policy = PolicyState(backend, len(server.model_names), getattr(server, "config", None))
    tuner = autotune_task(server, backend, policy)
    metrics.registry.register(PolicyCollector(backend, policy, tuner))
    app = FastAPI(title="TokenRouter", version="0.1.0", lifespan=lifespan)
    app.state.backend, app.state.metrics, app.state.policy, app.state.autotune = backend, metrics, policy, tuner
    app.state.frontend = FrontendState(server, tokenizer, backend, metrics, api_key)
    app.add_middleware(AuthMiddleware)
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.include_router(router)
    add_admin_routes(app, policy, admin_key, tuner)
    return app


class FrontendState:
    """What the OpenAI routes share, one per app (`app.state.frontend`)."""

    def __init__(self, server: ServerHandle, tokenizer, backend: Backend, metrics: FrontendMetrics,
                 api_key: str | None) -> None:  # fmt: skip
        self.server, self.tokenizer, self.backend, self.metrics = server, tokenizer, backend, metrics
        self.api_key = api_key
        self.name = served_model_name(server)
        self.accepted = {self.name, *server.model_names}  # the pair's name or one model's
        self.names = list(server.model_names)

    def check_model(self, model: str) -> str:
        if model not in self.accepted:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.name!r}", "model",
                           "model_not_found")  # fmt: skip
        return model

    def jobs(self, body: CompletionRequest | ChatRequest, prompts: list[list[int]],
             default_max: int | None) -> list[generate.Job]:  # fmt: skip
        """One job per choice: each prompt `n` times (choice j seeded seed + j), indexed prompt * n + j."""
        limits = params.Limits(self.server.vocab_size, self.backend.kv_capacity_tokens, self.server.max_context_len)
        where = ["prompt"] if len(prompts) == 1 else [f"prompt.{i}" for i in range(len(prompts))]
        sps = [params.sampling(body, ids, limits, default_max, w) for ids, w in zip(prompts, where, strict=True)]
        stop = params.stop_strings(body)
        chat = isinstance(body, ChatRequest)
        usage = bool(body.stream_options is not None and body.stream_options.include_usage)
        n, eos, out = body.n or 1, tuple(self.tokenizer.eos_token_ids), []
        for p, (ids, sp) in enumerate(zip(prompts, sps, strict=True)):
            for j in range(n):
                sp_j = sp if j == 0 else replace(sp, seed=params.choice_seed(sp.seed, j))
                out.append(generate.Job(ids, sp_j, eos, body.model, chat, bool(body.stream), stop,
                                        include_usage=usage, index=len(out), prompt_index=p))  # fmt: skip
        if len(out) > 1:
            for job in out[1:]:
                job.response_id, job.created = out[0].rid, out[0].created
            out[0].response_id = out[0].rid
        return out

    async def answer(self, jobs: list[generate.Job], request: Request):
        """Counts the request in flight until its answer is complete (a stream's end) and its outcome once."""
        metrics = self.metrics
        counted = False

        def on_outcome(outcome: str) -> None:
            nonlocal counted
            if not counted:
                counted = True
                metrics.in_flight.dec()
                metrics.requests.labels(outcome).inc()

        metrics.in_flight.inc()
        try:
            if len(jobs) == 1:
                return await generate.run(jobs[0], self.backend, self.tokenizer, self.names, request, on_outcome)
            return await choices.run_many(jobs, self.backend, self.tokenizer, self.names, request, on_outcome)
        except APIError:
            if not counted:  # the APIError handler counts the outcome
                counted = True
                metrics.in_flight.dec()
            raise
        except BaseException:
            on_outcome("error")
            raise

    def model_card(self, model_id: str) -> dict:
        # kv_capacity_tokens: what a client needs to size a load (how many requests' KV fits at once)
        ours = {"models": self.names, "entry": self.server.entry,
                "kv_capacity_tokens": {m.name: m.kv_capacity_tokens for m in self.backend.models}}  # fmt: skip
        return {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "tokenrouter",
                "max_model_len": self.server.max_context_len, "tokenrouter": ours}  # fmt: skip


def _state(request: Request) -> FrontendState:
    return request.app.state.frontend


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    backend, tuner = app.state.backend, app.state.autotune
    await backend.start()
    if tuner is not None:
        tuner.start()
    try:
        yield
    finally:
        if tuner is not None:
            await tuner.stop()
        await backend.close()


class AuthMiddleware:
    """The API key check, and a last-resort 500 in OpenAI's shape for a bug (the client's keep-alive connection stays
    usable). Plain ASGI, not `app.middleware("http")`: under Starlette's BaseHTTPMiddleware a route never sees the
    client leave (`Request.is_disconnected` stays False), and the routes poll it to abort abandoned requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        api_key = _state(request).api_key
        path = request.url.path
        if api_key is not None and path not in _OPEN_PATHS and not path.startswith("/admin/"):  # admin: own key
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
                answer = error_response(401, "missing or invalid API key (Authorization: Bearer KEY)", None,
                                        "invalid_api_key")  # fmt: skip
                await answer(scope, receive, send)
                return
        started = False

        async def send_watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_watched)
        except Exception:
            log.exception("unhandled error in %s %s", request.method, path)
            if started:  # too late for another answer: the server closes the connection
                raise
            await error_response(500, "internal server error")(scope, receive, send)


async def api_error(request: Request, e: APIError) -> JSONResponse:
    st = _state(request)
    st.metrics.requests.labels("error").inc()
    access.record(access.Entry("-", e.status, "invalid", 0, 0, 0, 0.0, e.message), st.backend.access_log)
    return error_response(e.status, e.message, e.param, e.code)


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    return await api_error(request, APIError(400, *validation_message(e.errors())))


async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    return error_response(e.status_code, str(e.detail))


router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    st = _state(request)
    st.check_model(body.model)
    # In a worker thread (the tokenizer releases the GIL): a long prompt must not stall the event loop.
    prompts = await asyncio.to_thread(params.completion_prompts, body, st.tokenizer.encode)
    return await st.answer(st.jobs(body, prompts, default_max=16), request)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    st = _state(request)
    st.check_model(body.model)
    ids = await asyncio.to_thread(params.chat_prompt, body, st.tokenizer)
    return await st.answer(st.jobs(body, [ids], default_max=None), request)


@router.get("/v1/models")
async def models(request: Request) -> dict:
    st = _state(request)
    return {"object": "list", "data": [st.model_card(st.name)]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request):
    """The card of any name a request may use; an unknown name is a 404 the request counters do not count."""
    st = _state(request)
    if model_id not in st.accepted:
        msg = f"the model {model_id!r} does not exist; this server serves {st.name!r}"
        return error_response(404, msg, "model", "model_not_found")
    return st.model_card(model_id)


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    backend = _state(request).backend
    if backend.draining:  # load balancers take the server out while it drains
        return JSONResponse({"status": "shutting down"}, status_code=503)
    bad = backend.unhealthy()
    if bad:
        return JSONResponse({"status": "unhealthy", "models": bad}, status_code=503)
    return JSONResponse({"status": "ok", "models": {n: "ok" for n in _state(request).names}})


@router.head("/health", include_in_schema=False)
async def health_head(request: Request) -> JSONResponse:
    """GET /health's status for probes that send HEAD (the server leaves the body out)."""
    return await health(request)


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    return Response(generate_latest(_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def autotune_task(server: ServerHandle, backend: Backend, policy: PolicyState) -> AutotuneTask | None:
    """The autotune task of a server whose config has `policy.autotune` (None otherwise)."""
    cfg = getattr(server, "config", None)
    if cfg is None or cfg.policy.autotune is None:
        return None
    from tokenrouter.sim.autotune_solve import make_controller  # the simulator, loaded only for autotune

    return AutotuneTask(backend, policy, make_controller(cfg, offload=True), server.entry)
