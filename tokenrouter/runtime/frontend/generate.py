"""One request as an OpenAI (chat) completion, streamed or whole. A stream waits for its first event, so a `Rejected`
is still a 4xx; later errors end it with an error chunk. Each request reports its outcome once (`on_outcome`)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.models.detokenize import IncrementalDetokenizer
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.errors import error_body, error_response
from tokenrouter.runtime.frontend.logprobs import LogprobFormatter
from tokenrouter.runtime.frontend.stop import StopStrings
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
    stop: tuple[str, ...] = ()
    include_usage: bool = False  # stream_options.include_usage: a usage-only chunk before [DONE]
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    index: int = 0  # the answer's `choices[].index` (`n` > 1 or a batch of prompts: `choices.py`)
    prompt_index: int = 0  # which prompt of a batch (usage counts each prompt once)
    response_id: str | None = None  # the answer's id when several jobs make one answer; None: from `rid`


@dataclass(slots=True)
class Piece:
    """What one chunk adds to the answer (`offsets[i]`: where token i's text starts in the answer's text)."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    models: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


class Output:
    """Turns in-order chunks into the answer. Invariant: `n` counts the tokens taken; after a stop string nothing
    more is taken (tokens go one at a time, so the one that completes it is known)."""

    def __init__(self, job: Job, tokenizer, names: Sequence[str]) -> None:
        self.job = job
        self.detok = IncrementalDetokenizer(tokenizer.decode)
        self.stops = StopStrings(job.stop)
        self.names, self.per_model, self.n = list(names), [0] * len(names), 0
        self.formatter = LogprobFormatter(tokenizer, job.chat) if job.sampling.logprobs is not None else None

    @property
    def stopped(self) -> bool:
        return self.stops.stopped

    def add(self, chunk: Chunk) -> Piece:
        piece = Piece()
        for k, tok in enumerate(chunk.ids):
            if self.stopped:
                break
            self.n += 1
            m = chunk.models[k]
            if 0 <= m < len(self.per_model):
                self.per_model[m] += 1
            piece.ids.append(tok)
            piece.models.append(m)
            piece.logprobs.append(chunk.logprobs[k] if k < len(chunk.logprobs) else None)
            piece.offsets.append(len(self.stops.text))
            piece.text += self.stops.push(self.detok.push([tok]))
        if self.stopped:
            piece.offsets = [min(o, self.stops.cut or 0) for o in piece.offsets]
        return piece

    def finish(self) -> str:
        """The text still held back once the output ended without a stop string completing it."""
        return self.stops.push(self.detok.flush()) + self.stops.flush()

    def logprobs(self, piece: Piece) -> dict[str, Any] | None:
        return None if self.formatter is None else self.formatter.format(piece.ids, piece.logprobs, piece.offsets)

    def usage(self) -> dict[str, int]:
        p = len(self.job.prompt_ids)
        return {"prompt_tokens": p, "completion_tokens": self.n, "total_tokens": p + self.n}

    def extension(self, out: Outcome | None) -> dict[str, Any]:
        """`hops` is null when the front-end ended the request (stop string) itself."""
        hops = None if out is None else out.num_hops
        return {"hops": hops, "tokens_per_model": dict(zip(self.names, self.per_model, strict=True))}


def envelope(job: Job, stream: bool) -> dict[str, Any]:
    obj = ("chat.completion.chunk" if stream else "chat.completion") if job.chat else "text_completion"
    prefix = "chatcmpl-" if job.chat else "cmpl-"
    return {"id": prefix + (job.response_id or job.rid), "object": obj, "created": job.created, "model": job.model}


def _choice(job: Job, text: str, finish: str | None, stream: bool, logprobs: dict | None,
            first: bool = False) -> dict[str, Any]:  # fmt: skip
    i = job.index
    if not job.chat:
        return {"index": i, "text": text, "finish_reason": finish, "logprobs": logprobs}
    if stream:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": i, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    message = {"role": "assistant", "content": text}
    return {"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs}


OnOutcome = Callable[[str], None]


async def run(job: Job, backend: Backend, tokenizer, names: Sequence[str], request: Request,
              on_outcome: OnOutcome) -> JSONResponse | StreamingResponse:  # fmt: skip
    """`tokenizer` decodes (`decode`) and spells tokens (`token_bytes`, for logprobs)."""
    stream = await backend.submit(P.Submit(job.rid, P.pack_ids(job.prompt_ids), job.sampling, job.eos_token_ids))
    first = await first_event(stream, backend, job.rid, request, on_outcome)
    if first is None:  # the client left before anything came back
        return error_response(499, "client closed the request")
    if isinstance(first, Outcome) and first.status is not None:
        backend.release(job.rid)
        on_outcome("error")
        return error_response(first.status, first.message)
    out = Output(job, tokenizer, names)
    if job.stream:
        gen = _sse(job, stream, first, backend, out, on_outcome)
        # A body never started (the client left first) never runs the generator's `finally`: clean up on collection.
        weakref.finalize(gen, abandon, backend, job.rid, on_outcome)
        return StreamingResponse(gen, media_type="text/event-stream")
    return await _whole(job, stream, first, backend, out, request, on_outcome)


async def first_event(stream: RequestStream, backend: Backend, rid: str, request: Request,
                      on_outcome: OnOutcome) -> Chunk | Outcome | None:  # fmt: skip
    """The request's first event, so that a rejection is still an HTTP error; None (request abandoned) if the client
    left first."""
    task = asyncio.ensure_future(stream.next())
    try:
        first = await _or_disconnect(task, request)
    except BaseException:
        task.cancel()
        abandon(backend, rid, on_outcome)
        raise
    if first is None:
        abandon(backend, rid, on_outcome)
    return first


def abandon(backend: Backend, rid: str, on_outcome: OnOutcome) -> None:
    """A request left without an answer: abort it on the subservers (a no-op once it ended) and count it."""
    backend.abort_nowait(rid)
    on_outcome("aborted")


async def _or_disconnect(task: asyncio.Future, request: Request, poll_s: float = 0.25):
    """`task`'s result, or None if the client disconnects first (`task` cancelled then, and if this is). The client
    is asked at least every `poll_s` of the request's life, also while events come faster than that: a non-streamed
    answer sends nothing before its end, so only this notices a client that left it."""
    try:
        while True:
            wait = _until_check(request, poll_s)
            if wait > 0:
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                continue
            request.state.disconnect_checked = time.monotonic()
            if await request.is_disconnected():
                task.cancel()
                return None
    except asyncio.CancelledError:
        task.cancel()  # a several-choice answer ending its other choices
        raise


def _until_check(request: Request, poll_s: float) -> float:
    """Seconds until the request's next disconnect check (0: due), shared by all of its choices."""
    now = time.monotonic()
    last = getattr(request.state, "disconnect_checked", None)
    if last is None:
        request.state.disconnect_checked = last = now
    return max(0.0, last + poll_s - now)


@dataclass(slots=True)
class Final:
    """One choice's last piece: its `choices[]` entry and its `tokenrouter` extension."""

    choice: dict[str, Any]
    ext: dict[str, Any]


@dataclass(slots=True)
class Failed:
    status: int
    message: str


async def collect(job: Job, stream: RequestStream, first: Chunk | Outcome, backend: Backend, out: Output,
                  request: Request) -> Final | Failed | None:  # fmt: skip
    """One choice read to its end (released or aborted on the subservers); None if the client left first (the
    caller abandons the request)."""
    text, ids, lps, offsets, ev = [], [], [], [], first
    while isinstance(ev, Chunk):
        piece = out.add(ev)
        text.append(piece.text)
        ids += piece.ids
        lps += piece.logprobs
        offsets += piece.offsets
        if out.stopped:
            break
        ev = await _or_disconnect(asyncio.ensure_future(stream.next()), request)
        if ev is None:
            return None
    if out.stopped:
        backend.abort_nowait(job.rid)  # ends it on the subservers; the answer is complete
        outcome, reason = None, "stop"
    else:
        backend.release(job.rid)
        if ev.status is not None:
            return Failed(ev.status, ev.message)
        text.append(out.finish())
        outcome, reason = ev, ev.reason
    choice = _choice(job, "".join(text), reason, False, out.logprobs(Piece("", ids, [], lps, offsets)))
    return Final(choice, out.extension(outcome))


async def _whole(job: Job, stream: RequestStream, first, backend: Backend, out: Output, request: Request,
                 on_outcome: OnOutcome) -> JSONResponse:  # fmt: skip
    res = await collect(job, stream, first, backend, out, request)
    if res is None:
        abandon(backend, job.rid, on_outcome)
        return error_response(499, "client closed the request")
    if isinstance(res, Failed):
        on_outcome("error")
        return error_response(res.status, res.message)
    on_outcome("ok")
    return JSONResponse({**envelope(job, stream=False), "choices": [res.choice], "usage": out.usage(),
                         "tokenrouter": res.ext})  # fmt: skip


def sse_line(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


@dataclass(slots=True)
class Delta:
    """A streamed piece of one choice: its `choices[]` entry and the model of each of its tokens."""

    choice: dict[str, Any]
    models: list[int]


async def choice_events(job: Job, stream: RequestStream, first: Chunk | Outcome, backend: Backend,
                        out: Output) -> AsyncIterator[Delta | Final | Failed]:  # fmt: skip
    """One choice as stream pieces: `Delta`s, then a `Final` (finish reason; the request released or aborted on the
    subservers) or a `Failed`."""
    ev, sent_first = first, False
    while isinstance(ev, Chunk):
        piece = out.add(ev)
        if out.stopped:
            break
        yield Delta(_choice(job, piece.text, None, True, out.logprobs(piece), first=not sent_first), piece.models)
        sent_first = True
        ev = await stream.next()
    if out.stopped:
        backend.abort_nowait(job.rid)
        outcome, reason, text = None, "stop", piece.text
    else:
        backend.release(job.rid)
        if ev.status is not None:
            yield Failed(ev.status, ev.message)
            return
        outcome, reason, text, piece = ev, ev.reason, out.finish(), Piece()
    choice = _choice(job, text, reason, True, out.logprobs(piece), first=not sent_first)
    yield Final(choice, {"models": piece.models} | out.extension(outcome))


async def _sse(job: Job, stream: RequestStream, first, backend: Backend, out: Output,
               on_outcome: OnOutcome) -> AsyncIterator[bytes]:  # fmt: skip
    """One chunk per in-order run of tokens (with each token's model), a last chunk with the finish reason, `usage`
    and `tokenrouter`, with `include_usage` a usage-only chunk, then `[DONE]`."""
    done = False
    try:
        async for ev in choice_events(job, stream, first, backend, out):
            if isinstance(ev, Delta):
                yield sse_line({**envelope(job, True), "choices": [ev.choice], "tokenrouter": {"models": ev.models}})
                continue
            done = True
            if isinstance(ev, Failed):
                on_outcome("error")
                yield sse_line(error_body(ev.status, ev.message))
                yield sse_line("[DONE]")
                return
            on_outcome("ok")
            yield sse_line({**envelope(job, stream=True), "choices": [ev.choice], "tokenrouter": ev.ext,
                            "usage": out.usage()})  # fmt: skip
            if job.include_usage:  # OpenAI's shape: empty choices, the whole request's usage
                yield sse_line({**envelope(job, stream=True), "choices": [], "usage": out.usage()})
            yield sse_line("[DONE]")
    finally:
        if not done:  # closed early: the client disconnected (or the server is stopping)
            abandon(backend, job.rid, on_outcome)
