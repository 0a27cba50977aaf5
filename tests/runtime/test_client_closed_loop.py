"""`RuntimeClient.closed_loop`: N clients, each sending its next request when its last one finished."""

from __future__ import annotations

import random

import pytest

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient

SAMPLING = P.Sampling(temperature=0.0, max_tokens=4, ignore_eos=True)


class Stub:
    """Submit/until without sockets: requests finish in a random order among those in flight."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.inflight: list[str] = []
        self.sent: list[str] = []
        self.peak = 0

    def submit(self, rid: str, prompt_ids, sampling) -> None:
        self.inflight.append(rid)
        self.sent.append(rid)
        self.peak = max(self.peak, len(self.inflight))

    def until(self, pred, timeout_s: float) -> list:
        if not self.inflight:
            raise TimeoutError("nothing in flight")  # the loop waited for a request it never sent
        rid = self.inflight.pop(self.rng.randrange(len(self.inflight)))
        ev = P.Finished(rid, "length", 4, 0)
        assert pred(ev)
        return [ev]


@pytest.mark.parametrize(("jobs", "n"), [(10, 3), (2, 8), (5, 1), (0, 4)])
def test_keeps_n_in_flight_and_sends_every_job_once_in_order(jobs, n):
    stub = Stub(seed=jobs * 10 + n)
    js = [(f"r{i}", [1, 2, 3], SAMPLING) for i in range(jobs)]
    RuntimeClient.closed_loop(stub, js, n)
    assert stub.sent == [f"r{i}" for i in range(jobs)]
    assert stub.inflight == []  # returned only when every request had finished
    assert stub.peak == min(n, jobs)
