"""ZeroMQ sockets the runtime's processes open the same way."""

from __future__ import annotations

from collections.abc import Iterator

import zmq


def push_socket(ctx: zmq.Context, addr: str, *, linger_ms: int = 2000) -> zmq.Socket:
    """A PUSH socket connected to `addr`. No send high-water mark: a peer's messages are the scheduler's state (a
    hand-off, a token), so a slow reader must queue them, never drop or block them; `linger_ms` lets a closing
    process flush what it queued."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, linger_ms)
    s.setsockopt(zmq.SNDHWM, 0)
    s.connect(addr)
    return s


def send_once(ctx: zmq.Context, addr: str, frames: list[bytes], *, linger_ms: int = 2000) -> None:
    """One message to `addr` on a socket of its own (to a process this one holds no socket to); the close waits up to
    `linger_ms` for it to leave."""
    s = push_socket(ctx, addr, linger_ms=linger_ms)
    s.send_multipart(frames)
    s.close()


def drain(sock: zmq.Socket, timeout_ms: int) -> Iterator[list[bytes]]:
    """The messages that arrived on `sock` within `timeout_ms`, then every one already queued behind them, without
    blocking again: a loop handles a burst in one pass and returns to its other duties (heartbeats, `stopping`)."""
    if not sock.poll(timeout_ms):
        return
    while True:
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
