"""Run one request against the backend and shape the answer as an OpenAI completion or chat completion,
streamed (SSE) or whole.

A streamed request waits for its first event before answering, so a `Rejected` (or a failure before any
token) still becomes a proper 4xx/5xx instead of a 200 stream that carries an error. Once streaming, an
error ends the stream with an `{"error": ...}` chunk and `[DONE]`. A client that goes away (the SSE
generator is closed, or a whole request sees the disconnect) sends `Abort(rid)` to the entry subserver.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.models.detokenize import IncrementalDetokenizer
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.errors import error_body, error_response
from tokenrouter.runtime.frontend.stream import Chunk, Outcome, RequestStream


@dataclass(slots=True)
class Job:
    """One request as the HTTP layer shapes it: `chat` picks the chat schema."""

    prompt_ids: list[int]
    sampling: P.Sampling
    eos_token_ids: tuple[int, ...]
    model: str
    chat: bool
    stream: bool
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


class _Tally:
    """Output counted per model, for `usage` and the `tokenrouter` field."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names, self.per_model, self.n = list(names), [0] * len(names), 0

    def add(self, chunk: Chunk) -> None:
        self.n += len(chunk.ids)
        for m in chunk.models:
            if 0 <= m < len(self.per_model):
                self.per_model[m] += 1

    def usage(self, prompt_len: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_len, "completion_tokens": self.n, "total_tokens": prompt_len + self.n}

    def extension(self, out: Outcome) -> dict[str, Any]:
        return {"hops": out.num_hops, "tokens_per_model": dict(zip(self.names, self.per_model, strict=True))}


def _envelope(job: Job, stream: bool) -> dict[str, Any]:
    obj = ("chat.completion.chunk" if stream else "chat.completion") if job.chat else "text_completion"
    prefix = "chatcmpl-" if job.chat else "cmpl-"
    return {"id": prefix + job.rid, "object": obj, "created": job.created, "model": job.model}


def _choice(job: Job, text: str, finish: str | None, stream: bool, first: bool = False) -> dict[str, Any]:
    if not job.chat:
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if stream:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": None}


async def run(
    job: Job, backend: Backend, decode: Callable[[Sequence[int]], str], names: Sequence[str], request: Request
) -> JSONResponse | StreamingResponse:
    stream = await backend.submit(P.Submit(job.rid, P.pack_ids(job.prompt_ids), job.sampling, job.eos_token_ids))
    first_task = asyncio.ensure_future(stream.next())
    try:
        first = await _or_disconnect(first_task, request)
    except BaseException:
        first_task.cancel()
        backend.abort_nowait(job.rid)
        raise
    if first is None:  # the client left before anything came back
        backend.abort_nowait(job.rid)
        return error_response(499, "client closed the request")
    if isinstance(first, Outcome) and first.status is not None:
        backend.release(job.rid)
        return error_response(first.status, first.message)
    if job.stream:
        return StreamingResponse(_sse(job, stream, first, backend, decode, names), media_type="text/event-stream")
    return await _whole(job, stream, first, backend, decode, names, request)


async def _or_disconnect(task: asyncio.Future, request: Request, poll_s: float = 0.25):
    """`task`'s result, or None if the client disconnects first."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            return None


async def _whole(job, stream: RequestStream, first, backend: Backend, decode, names, request) -> JSONResponse:
    tally, ids, ev = _Tally(names), [], first
    while isinstance(ev, Chunk):
        tally.add(ev)
        ids.extend(ev.ids)
        ev = await _or_disconnect(asyncio.ensure_future(stream.next()), request)
        if ev is None:
            backend.abort_nowait(job.rid)
            return error_response(499, "client closed the request")
    backend.release(job.rid)
    if ev.status is not None:
        return error_response(ev.status, ev.message)
    body = _envelope(job, stream=False)
    body["choices"] = [_choice(job, decode(ids), ev.reason, stream=False)]
    body["usage"] = tally.usage(len(job.prompt_ids))
    body["tokenrouter"] = tally.extension(ev)
    return JSONResponse(body)


def _sse_line(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _sse(job, stream: RequestStream, first, backend: Backend, decode, names) -> AsyncIterator[bytes]:
    """SSE chunks: one per in-order run of tokens (text delta plus, as an extension, the model of each token),
    then a last chunk with the finish reason, `usage` and `tokenrouter`, then `[DONE]`."""
    detok, tally, ev, done, sent_first = IncrementalDetokenizer(decode), _Tally(names), first, False, False
    try:
        while isinstance(ev, Chunk):
            tally.add(ev)
            body = _envelope(job, stream=True)
            body["choices"] = [_choice(job, detok.push(ev.ids), None, stream=True, first=not sent_first)]
            body["tokenrouter"] = {"models": ev.models}
            sent_first = True
            yield _sse_line(body)
            ev = await stream.next()
        done = True
        backend.release(job.rid)
        if ev.status is not None:
            yield _sse_line(error_body(ev.status, ev.message))
        else:
            body = _envelope(job, stream=True)
            body["choices"] = [_choice(job, detok.flush(), ev.reason, stream=True, first=not sent_first)]
            body["usage"] = tally.usage(len(job.prompt_ids))
            body["tokenrouter"] = tally.extension(ev)
            yield _sse_line(body)
        yield _sse_line("[DONE]")
    finally:
        if not done:  # closed early: the client disconnected (or the server is stopping)
            backend.abort_nowait(job.rid)
