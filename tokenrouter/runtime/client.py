"""`RuntimeClient`: the front-end side of the runtime's sockets, without HTTP (tests, studies). One thread only."""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.sockets import push_socket


class RuntimeClient:
    def __init__(self, addresses: Addresses, entry: int = 0) -> None:
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(addresses.bind(addresses.frontend))
        self.push = push_socket(self.ctx, addresses.entry_address(entry), linger_ms=0)

    def submit(self, rid: str, prompt_ids: Sequence[int], sampling: P.Sampling,
               eos_token_ids: Sequence[int] = ()) -> None:  # fmt: skip
        msg = P.Submit(rid, P.pack_ids(list(prompt_ids)), sampling, tuple(eos_token_ids))
        self.push.send_multipart([P.CTL, P.encode(msg)])

    def abort(self, rid: str) -> None:
        self.push.send_multipart([P.CTL, P.encode(P.Abort(rid))])

    def recv(self, timeout_s: float) -> P.ToFrontend | None:
        if not self.pull.poll(int(timeout_s * 1000)):
            return None
        _, data = self.pull.recv_multipart()
        return P.decode_for_frontend(data)

    def until(self, pred, timeout_s: float) -> list[P.ToFrontend]:
        """Receive events until `pred(event)` is true for one (returned last); raises TimeoutError."""
        out: list[P.ToFrontend] = []
        deadline = time.monotonic() + timeout_s
        while True:
            ev = self.recv(max(0.0, deadline - time.monotonic()))
            if ev is None:
                raise TimeoutError(f"no matching event within {timeout_s} s ({len(out)} others)")
            out.append(ev)
            if pred(ev):
                return out

    def closed_loop(self, jobs: Sequence[tuple[str, Sequence[int], P.Sampling]], concurrency: int,
                    timeout_s: float = 300.0) -> None:  # fmt: skip
        """Run `jobs` (rid, prompt ids, sampling) as `concurrency` closed-loop clients, until all finished."""
        for job in jobs[:concurrency]:
            self.submit(*job)
        for k in range(concurrency, len(jobs) + concurrency):
            self.until(lambda ev: isinstance(ev, P.Finished), timeout_s)
            if k < len(jobs):
                self.submit(*jobs[k])

    def close(self) -> None:
        self.pull.close(linger=0)
        self.push.close()
        self.ctx.term()
