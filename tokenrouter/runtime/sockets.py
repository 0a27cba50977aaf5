"""ZeroMQ sockets the runtime's processes open the same way."""

from __future__ import annotations

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
