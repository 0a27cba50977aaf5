"""Several choices in one answer: `n` > 1, and a batch of prompts on /v1/completions. Each choice is a request of
its own on the subservers (its rid, KV pages and hops); the answer joins them as OpenAI does: `choices[]` ordered by
index (prompt * n + j), `usage` counting each prompt once and every choice's tokens, and a stream interleaving the
choices' chunks as they come. One choice failing fails the answer and ends the others."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.errors import error_body, error_response
from tokenrouter.runtime.frontend.generate import (
    Delta,
    Failed,
    Final,
    Job,
    OnOutcome,
    Output,
    choice_events,
    collect,
    envelope,
    first_event,
    sse_line,
)
from tokenrouter.runtime.frontend.stream import Outcome, RequestStream

_GONE = object()  # a choice's reader saw the client leave
log = logging.getLogger("tokenrouter.frontend")


def usage(outs: Sequence[Output]) -> dict[str, int]:
    """Each prompt's tokens once (the `n` choices of a prompt share it), every choice's output tokens."""
    prompts = {o.job.prompt_index: len(o.job.prompt_ids) for o in outs}
    p, c = sum(prompts.values()), sum(o.n for o in outs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def joined_extension(exts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The answer's `tokenrouter`: hops and tokens per model summed over its choices (hops null when no choice
    reports any: each was ended by a stop string in the front-end)."""
    hops = [e["hops"] for e in exts if e["hops"] is not None]
    per_model: dict[str, int] = {}
    for e in exts:
        for name, k in e["tokens_per_model"].items():
            per_model[name] = per_model.get(name, 0) + k
    return {"hops": sum(hops) if hops else None, "tokens_per_model": per_model}


def _end_all(backend: Backend, jobs: Sequence[Job]) -> None:
    """Abort every choice still running (a no-op for the ones that ended)."""
    for job in jobs:
        backend.abort_nowait(job.rid)


async def run_many(jobs: Sequence[Job], backend: Backend, tokenizer, names: Sequence[str], request: Request,
                   on_outcome: OnOutcome) -> JSONResponse | StreamingResponse:  # fmt: skip
    """Every job submitted, then answered as one (`jobs[i].index == i`, one `response_id`)."""
    streams: list[RequestStream] = []
    try:
        for job in jobs:
            streams.append(await backend.submit(P.Submit(job.rid, P.pack_ids(job.prompt_ids), job.sampling,
                                                         job.eos_token_ids)))  # fmt: skip
    except BaseException:
        _end_all(backend, jobs[: len(streams)])
        raise
    firsts = []
    for job, stream in zip(jobs, streams, strict=True):
        first = await first_event(stream, backend, job.rid, request, on_outcome)
        if first is None:  # the client left: `first_event` counted it
            _end_all(backend, jobs)
            return error_response(499, "client closed the request")
        if isinstance(first, Outcome) and first.status is not None:
            backend.release(job.rid)
            _end_all(backend, jobs)
            on_outcome("error")
            return error_response(first.status, first.message)
        firsts.append(first)
    outs = [Output(job, tokenizer, names) for job in jobs]
    if jobs[0].stream:
        gen = _sse_many(jobs, streams, firsts, backend, outs, on_outcome)
        weakref.finalize(gen, _abandon_all, backend, jobs, on_outcome)
        return StreamingResponse(gen, media_type="text/event-stream")
    return await _whole_many(jobs, streams, firsts, backend, outs, request, on_outcome)


def _abandon_all(backend: Backend, jobs: Sequence[Job], on_outcome: OnOutcome) -> None:
    _end_all(backend, jobs)
    on_outcome("aborted")


async def _whole_many(jobs: Sequence[Job], streams: Sequence[RequestStream], firsts: list, backend: Backend,
                      outs: Sequence[Output], request: Request, on_outcome: OnOutcome) -> JSONResponse:  # fmt: skip
    tasks = [asyncio.ensure_future(collect(*args, backend, out, request))
             for args, out in zip(zip(jobs, streams, firsts, strict=True), outs, strict=True)]  # fmt: skip
    results: dict[int, Final] = {}
    bad: Failed | object | None = None
    try:
        pending = set(tasks)
        while pending and bad is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                res = t.result()
                if isinstance(res, Final):
                    results[tasks.index(t)] = res
                elif bad is None:
                    bad = _GONE if res is None else res
    finally:
        for t in tasks:
            t.cancel()
        if bad is not None or len(results) < len(jobs):
            _end_all(backend, jobs)
    if bad is _GONE:
        on_outcome("aborted")
        return error_response(499, "client closed the request")
    if isinstance(bad, Failed):
        on_outcome("error")
        return error_response(bad.status, bad.message)
    finals = [results[i] for i in range(len(jobs))]
    on_outcome("ok")
    return JSONResponse({**envelope(jobs[0], stream=False),
                         "choices": [f.choice | {"tokenrouter": f.ext} for f in finals], "usage": usage(outs),
                         "tokenrouter": joined_extension([f.ext for f in finals])})  # fmt: skip


async def _sse_many(jobs: Sequence[Job], streams: Sequence[RequestStream], firsts: list, backend: Backend,
                    outs: Sequence[Output], on_outcome: OnOutcome) -> AsyncIterator[bytes]:  # fmt: skip
    """Each choice's chunks as they come (its own index), each choice's last chunk with its finish reason and
    `tokenrouter`; after the last choice, with `include_usage`, the usage-only chunk; then `[DONE]`."""
    queue: asyncio.Queue[Delta | Final | Failed | None] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for ev in choice_events(jobs[i], streams[i], firsts[i], backend, outs[i]):
                queue.put_nowait(ev)
        except Exception:  # a bug in one choice fails the answer in OpenAI's shape, not a hung stream
            log.exception("choice %d of %s", i, jobs[i].response_id)
            queue.put_nowait(Failed(500, "internal server error"))
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(jobs))]
    head, done, running, exts = envelope(jobs[0], stream=True), False, len(jobs), []
    try:
        while running:
            ev = await queue.get()
            if ev is None:
                running -= 1
            elif isinstance(ev, Failed):
                done = True
                _end_all(backend, jobs)
                on_outcome("error")
                yield sse_line(error_body(ev.status, ev.message))
                yield sse_line("[DONE]")
                return
            elif isinstance(ev, Delta):
                yield sse_line({**head, "choices": [ev.choice], "tokenrouter": {"models": ev.models}})
            else:
                exts.append(ev.ext)
                yield sse_line({**head, "choices": [ev.choice], "tokenrouter": ev.ext})
        done = True
        on_outcome("ok")
        if jobs[0].include_usage:
            yield sse_line({**head, "choices": [], "usage": usage(outs), "tokenrouter": joined_extension(exts)})
        yield sse_line("[DONE]")
    finally:
        for t in tasks:
            t.cancel()
        if not done:  # closed early: the client disconnected (or the server is stopping)
            _abandon_all(backend, jobs, on_outcome)
