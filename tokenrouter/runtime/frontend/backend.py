"""The front-end's ZeroMQ side: a reader task feeding per-request streams, a PUSH to the entry, and a watchdog; a
model's death fails every request in flight (docs/runtime.md, "Front-end liveness")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from tokenrouter.core.autotune_counters import RECENT_OUTPUTS
from tokenrouter.core.config import PolicyConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend import access
from tokenrouter.runtime.frontend.errors import APIError
from tokenrouter.runtime.frontend.handle import ServerHandle
from tokenrouter.runtime.frontend.stream import RequestStream

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelState:
    name: str
    kv_capacity_tokens: int
    ready: bool = False
    dead: str | None = None  # why, once dead
    last_seen: float | None = None  # front-end monotonic time of the last message from this model
    stats: P.Stats | None = None


class Backend:
    """Owns the sockets and the per-request streams of one front-end. Not thread-safe: one event loop."""

    def __init__(
        self, handle: ServerHandle, *, heartbeat_timeout_s: float = 10.0, poll_s: float = 0.2, clock=time.monotonic,
        access_log: bool = True,
    ) -> None:  # fmt: skip
        self.handle, self.access_log = handle, access_log
        self.draining = False  # shutting down: new requests get 503, running ones may finish (`drain`)
        self.drain_deadline: float | None = None
        self._started: dict[str, tuple[float, int]] = {}  # rid -> (submit time, prompt tokens), for the access log
        self.heartbeat_timeout_s, self.poll_s, self.clock = heartbeat_timeout_s, poll_s, clock
        caps = handle.kv_capacity_tokens
        self.models = [ModelState(n, int(c)) for n, c in zip(handle.model_names, caps, strict=True)]
        self.streams: dict[str, RequestStream] = {}
        self.on_stats: Callable[[P.Stats], None] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._push: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._policy_seq = 0
        self._policy_acks: dict[tuple[int, int], asyncio.Future] = {}  # (seq, model) -> PolicySet
        # Requests the subservers finished (reason stop or length) and their output tokens, cumulative: autotune's
        # mean output length (counted here: a request ends on whichever model wrote its last token).
        self.finished = 0
        self.finished_tokens = 0
        self.finished_tokens_sq = 0
        self.recent_outputs: deque[int] = deque(maxlen=RECENT_OUTPUTS)  # autotune's trials replay their shape

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(self.handle.addresses.bind(self.handle.addresses.frontend))
        self._push = self._push_socket(self.handle.addresses.entry_address(self.handle.entry), 0)
        self._tasks = [asyncio.create_task(self._reader()), asyncio.create_task(self._watchdog())]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        for s in list(self.streams.values()):
            s.fail(503, "the server is shutting down")
        for sock in (self._pull, self._push):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._ctx = self._pull = self._push = None

    @property
    def kv_capacity_tokens(self) -> int:
        """The smallest KV pool over the models: a request may visit every model."""
        return min(m.kv_capacity_tokens for m in self.models)

    def unhealthy(self) -> dict[str, str]:
        """model name -> why it is not serving (empty when every model is alive and ready)."""
        self._check_alive()
        return {m.name: f"dead: {m.dead}" if m.dead else "not ready" for m in self.models if m.dead or not m.ready}

    async def submit(self, msg: P.Submit) -> RequestStream:
        if self.draining:
            raise APIError(503, "the server is shutting down")
        bad = self.unhealthy()
        if bad:
            raise APIError(503, "server not ready: " + "; ".join(f"{k} {v}" for k, v in bad.items()))
        if msg.rid in self.streams:
            raise APIError(400, f"request id {msg.rid!r} is already in flight")
        stream = RequestStream(msg.rid)
        self.streams[msg.rid] = stream
        try:
            await self._send(msg)
        except BaseException:
            self.streams.pop(msg.rid, None)
            raise
        self._started[msg.rid] = (self.clock(), len(msg.prompt_ids) // 4)  # int32 ids (`pack_ids`)
        return stream

    def abort_nowait(self, rid: str) -> None:
        """Tell the entry subserver to drop `rid`; forget the stream. Synchronous (a non-blocking send): it runs in
        the `finally` of a cancelled SSE generator."""
        stream = self.streams.pop(rid, None)
        if stream is None:
            return
        self._log_end(stream, client_gone=True)
        if self._push is None:
            return
        try:
            fut = self._push.send_multipart([P.CTL, P.encode(P.Abort(rid))], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        fut.add_done_callback(lambda f: f.exception())  # retrieve it: a full queue only loses the abort

    def release(self, rid: str) -> None:
        stream = self.streams.pop(rid, None)
        if stream is not None:
            self._log_end(stream)

    def _log_end(self, stream: RequestStream, client_gone: bool = False) -> None:
        t0, prompt = self._started.pop(stream.rid, (self.clock(), 0))
        f, fin = stream.failure, stream.finished
        if client_gone:
            status, finish, msg = 499, "aborted", ""
        elif f is not None:
            status, finish, msg = f.status or 500, f.reason, f.message
        else:
            status, finish, msg = 200, fin.reason if fin is not None else "?", ""
        hops = fin.num_hops if fin is not None else 0
        entry = access.Entry(stream.rid, status, finish, prompt, stream.next_pos, hops, self.clock() - t0, msg)
        access.record(entry, self.access_log)

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new requests (503), give the running ones until `drain_deadline` (`grace_s`; a second
        signal moves it closer), then end the rest with a 503 and give their handlers a moment to write it."""
        self.draining = True
        self.drain_deadline = self.clock() + grace_s
        while self.streams and self.clock() < self.drain_deadline:
            await asyncio.sleep(0.05)
        if self.streams:
            log.warning("shutdown: ending %d requests still running after %.0f s", len(self.streams), grace_s)
            for s in list(self.streams.values()):
                s.fail(503, "the server is shutting down")
        end = self.clock() + 2.0
        while self.streams and self.clock() < end:
            await asyncio.sleep(0.02)

    async def set_policy(self, policy: PolicyConfig, hop_rate: float | None, timeout_s: float = 10.0) -> list[str]:
        """Send a policy to every subserver and wait until each applied it; the errors of those that refused it."""
        if self._ctx is None:
            raise APIError(503, "the server is not running")
        self._policy_seq += 1
        msg = P.SetPolicy(self._policy_seq, policy, hop_rate)
        loop = asyncio.get_running_loop()
        futs = {i: loop.create_future() for i in range(len(self.models))}
        self._policy_acks.update({(msg.seq, i): f for i, f in futs.items()})
        socks = []
        try:
            for addr in self.handle.addresses.subservers:
                s = self._push_socket(addr, 1000)
                socks.append(s)
                await s.send_multipart([P.CTL, P.encode(msg)])
            _, pending = await asyncio.wait(futs.values(), timeout=timeout_s)
        finally:
            for s in socks:
                s.close()
            for i in futs:
                self._policy_acks.pop((msg.seq, i), None)
        if pending:
            late = [self.models[i].name for i, f in futs.items() if not f.done()]
            raise APIError(504, f"no answer to the policy change from {', '.join(late)} within {timeout_s:.0f} s")
        return [f"{self.models[i].name}: {f.result().error}" for i, f in futs.items() if f.result().error]

    async def _send(self, msg: P.Submit | P.Abort) -> None:
        assert self._push is not None, "backend not started"
        try:
            await self._push.send_multipart([P.CTL, P.encode(msg)], flags=zmq.NOBLOCK)
        except zmq.Again:
            raise APIError(503, "the entry subserver is not accepting requests (queue full)") from None

    async def _reader(self) -> None:
        assert self._pull is not None
        while True:
            frames = await self._pull.recv_multipart()
            if len(frames) != 2 or frames[0] != P.CTL:
                continue
            try:
                msg = P.decode_for_frontend(frames[1])
            except Exception:  # a malformed frame must not kill the reader of every request
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: P.ToFrontend) -> None:
        if isinstance(msg, P.Tokens | P.Finished | P.Rejected):
            if isinstance(msg, P.Finished) and msg.reason in ("stop", "length"):
                self.finished += 1
                self.finished_tokens += msg.num_output
                self.finished_tokens_sq += msg.num_output**2
                self.recent_outputs.append(msg.num_output)
            stream = self.streams.get(msg.rid)
            if stream is None:
                return  # aborted or already failed: late events are dropped
            if isinstance(msg, P.Tokens):
                self._seen(msg.model)
                stream.on_tokens(msg)
            elif isinstance(msg, P.Finished):
                stream.on_finished(msg)
            else:
                stream.fail(msg.status, msg.message, reason="rejected")
            return
        m = self.models[msg.model] if 0 <= msg.model < len(self.models) else None
        if m is None:
            return
        self._seen(msg.model)
        if isinstance(msg, P.PolicySet):
            fut = self._policy_acks.get((msg.seq, msg.model))
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        if isinstance(msg, P.Ready):
            if m.dead:  # restarted by the launcher (--restart-on-failure): serving again
                log.warning("model %d (%s) is back: serving again", msg.model, m.name)
                m.dead = None
                if msg.model == self.handle.entry:
                    self._reconnect_entry()
            m.ready = True
            m.kv_capacity_tokens = msg.kv_capacity_tokens
        elif isinstance(msg, P.Stats):
            m.ready = True
            m.stats = msg
            if self.on_stats is not None:
                self.on_stats(msg)
        elif isinstance(msg, P.Failed):
            self._mark_dead(msg.model, msg.message)

    def _reconnect_entry(self) -> None:
        """A new socket to a restarted entry: what the old one still queued must not reach the new process."""
        if self._ctx is None or self._push is None:
            return
        self._push.close(linger=0)
        self._push = self._push_socket(self.handle.addresses.entry_address(self.handle.entry), 0)

    def _push_socket(self, address: str, linger_ms: int) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        s = self._ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, linger_ms)
        s.connect(address)
        return s

    def _seen(self, i: int) -> None:
        if 0 <= i < len(self.models):
            self.models[i].last_seen = self.clock()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self._check_alive()

    def _check_alive(self) -> None:
        now = self.clock()
        for i, m in enumerate(self.models):
            if m.dead:
                continue
            if not self.handle.is_alive(i):
                self._mark_dead(i, "process exited")
            elif m.last_seen is not None and now - m.last_seen > self.heartbeat_timeout_s:
                self._mark_dead(i, f"no heartbeat for {now - m.last_seen:.1f} s")

    def _mark_dead(self, i: int, why: str) -> None:
        m = self.models[i]
        if m.dead:
            return
        m.dead = why
        log.error("subserver %d (%s) is down (%s): failing %d requests in flight", i, m.name, why, len(self.streams))
        for s in list(self.streams.values()):
            s.fail(503, f"subserver {i} ({m.name}) died: {why}")
