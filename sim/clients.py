"""Load generators: closed loop (N clients, each sends its next request when the last finishes, as the
TokenRouter paper measures) and open loop (Poisson arrivals at the times the workload carries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import simpy

from tokenrouter.workloads import RequestSpec


class ClosedLoop:
    """`concurrency` clients share one request iterator. `exhausted_at` is the first time a client found
    none left: from then on fewer than N requests are live, so it ends the steady-state window.
    """

    def __init__(
        self,
        env: simpy.Environment,
        specs: list[RequestSpec],
        concurrency: int,
        submit: Callable[[RequestSpec], simpy.Event],
    ) -> None:
        self.env = env
        self._it: Iterator[RequestSpec] = iter(specs)
        self.submit = submit
        self.exhausted_at: float | None = None
        self.procs = [env.process(self._client()) for _ in range(concurrency)]

    def _client(self):
        for spec in self._it:
            yield self.submit(spec)
        if self.exhausted_at is None:
            self.exhausted_at = self.env.now


class OpenLoop:
    """Submits each request at `spec.arrival` seconds, whatever the system's state."""

    def __init__(self, env: simpy.Environment, specs: list[RequestSpec], submit: Callable[[RequestSpec], simpy.Event]):
        self.env = env
        self.exhausted_at: float | None = None
        self.proc = env.process(self._arrivals(sorted(specs, key=lambda s: s.arrival or 0.0), submit))

    def _arrivals(self, specs: list[RequestSpec], submit: Callable[[RequestSpec], simpy.Event]):
        for spec in specs:
            wait = (spec.arrival or 0.0) - self.env.now
            if wait > 0:
                yield self.env.timeout(wait)
            submit(spec)
