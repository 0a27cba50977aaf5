"""ZeroMQ sockets the runtime's processes open the same way."""

from __future__ import annotations

from collections.abc import Iterator

import zmq


def push_socket(ctx: zmq.Context, addr: str, *, linger_ms: int = 2000) -> zmq.Socket:
    """A PUSH socket connected to `addr`, without a send high-water mark: its messages are the scheduler's state,
    queued for a slow reader, never dropped."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, linger_ms)
    s.setsockopt(zmq.SNDHWM, 0)
    s.connect(addr)
    return s


def send_once(ctx: zmq.Context, addr: str, frames: list[bytes], *, linger_ms: int = 2000) -> None:
    """One message to `addr` on a socket of its own; the close waits up to `linger_ms` for it to leave."""
    s = push_socket(ctx, addr, linger_ms=linger_ms)
    s.send_multipart(frames)
    s.close()


def drain(sock: zmq.Socket, timeout_ms: int) -> Iterator[list[bytes]]:
    """The messages that arrived on `sock` within `timeout_ms`, then those queued behind them, without blocking."""
    if not sock.poll(timeout_ms):
        return
    while True:
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
