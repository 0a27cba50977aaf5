"""Load generators: closed loop (N clients, each sends its next request when the last finishes, as the
TokenRouter paper measures) and open loop (Poisson arrivals at the times the workload carries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import simpy

from tokenrouter.workloads import RequestSpec


class ClosedLoop:
    """`concurrency` clients share one request iterator. `exhausted_at` is the first time a client found none left:
    it ends the steady-state window. `set_concurrency(n)` (a workload phase): more clients start at once; with
    fewer, clients retire as their current request finishes."""

    def __init__(self, env: simpy.Environment, specs: list[RequestSpec], concurrency: int,
                 submit: Callable[[RequestSpec], simpy.Event]) -> None:  # fmt: skip
        self.env = env
        self._it: Iterator[RequestSpec] = iter(specs)
        self.submit = submit
        self.exhausted_at: float | None = None
        self.exhausted = env.event()  # succeeds at `exhausted_at` (a trial run stops there)
        self.target = concurrency
        self.clients = 0  # running client processes
        self.procs: list[simpy.Process] = []
        self._start(concurrency)

    @property
    def done(self) -> bool:
        return self.clients == 0

    def set_concurrency(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"concurrency must be >= 1, got {n}")
        self.target = n
        if self.exhausted_at is None:
            self._start(n - self.clients)

    def _start(self, k: int) -> None:
        for _ in range(max(0, k)):
            self.clients += 1
            self.procs.append(self.env.process(self._client()))

    def _client(self):
        for spec in self._it:
            yield self.submit(spec)
            if self.clients > self.target:  # a phase lowered N: retire before taking another request
                break
        else:
            if self.exhausted_at is None:
                self.exhausted_at = self.env.now
                self.exhausted.succeed()
        self.clients -= 1


class OpenLoop:
    """Submits each request at `spec.arrival` seconds, whatever the system's state."""

    def __init__(self, env: simpy.Environment, specs: list[RequestSpec], submit: Callable[[RequestSpec], simpy.Event]):
        self.env = env
        self.exhausted_at: float | None = None
        self.proc = env.process(self._arrivals(sorted(specs, key=lambda s: s.arrival or 0.0), submit))

    @property
    def done(self) -> bool:
        """Every request was submitted (the run ends when they finish)."""
        return not self.proc.is_alive

    def _arrivals(self, specs: list[RequestSpec], submit: Callable[[RequestSpec], simpy.Event]):
        for spec in specs:
            wait = (spec.arrival or 0.0) - self.env.now
            if wait > 0:
                yield self.env.timeout(wait)
            submit(spec)
