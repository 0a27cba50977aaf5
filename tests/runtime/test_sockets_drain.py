"""`runtime.sockets.drain`: what arrived within the timeout and everything queued behind it, then no more waiting."""

from __future__ import annotations

import time

import zmq

from tokenrouter.runtime.sockets import drain, push_socket


def test_drain_takes_the_whole_burst_then_returns_without_waiting():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://drain-test")
    push = push_socket(ctx, "inproc://drain-test", linger_ms=0)
    try:
        assert list(drain(pull, 10)) == []  # nothing arrived: none, after the timeout
        for i in range(5):
            push.send_multipart([b"ch", str(i).encode()])
        time.sleep(0.05)
        got = list(drain(pull, 1000))
        assert got == [[b"ch", str(i).encode()] for i in range(5)]
        assert list(drain(pull, 0)) == []  # the burst is gone: nothing is handed out twice
    finally:
        push.close()
        pull.close(linger=0)
        ctx.term()
