"""A tiny synchronous driver for scheduler tests: schedulers in one process, messages delivered at once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Emit, Finish, Send
from tokenrouter.core.policy import Policy, SyncGate
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler


class ScriptedRouter(Router):
    """Routes by a per-(model, rid) script of destinations; stays when the script runs out."""

    def __init__(self, script: dict[tuple[int, str], list[int]] | None = None, keep_from: Sequence[int] = (1,)) -> None:
        super().__init__()
        self.script = script if script is not None else {}
        self.keep_from = set(keep_from)

    def route(self, batch: Batch, result: StepResult) -> list[int]:
        out = []
        for row in batch.rows:
            q = self.script.get((self.model, row.req.rid), [])
            out.append(q.pop(0) if q else self.model)
        return out

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.model in self.keep_from


def token_for(model: int, row_index: int, pos: int) -> int:
    return 1000 * (model + 1) + pos


class Cluster:
    def __init__(
        self,
        num_models: int = 2,
        *,
        pages: int = 64,
        page_size: int = 4,
        policy: Policy | None = None,
        router_script: dict | None = None,
        overlap: bool = False,
    ) -> None:
        policy = policy or Policy()
        gate = SyncGate(policy.kind, num_models) if policy.is_sync else None
        script = router_script if router_script is not None else {}
        self.scheds = [
            Scheduler(
                m,
                num_models,
                kv=KVPool(pages, page_size),
                router=ScriptedRouter(script),
                policy=policy,
                gate=gate,
                overlap=overlap,
            )
            for m in range(num_models)
        ]
        self.emitted: dict[str, list[tuple[int, int, int]]] = {}
        self.finished: dict[str, str] = {}
        self.batches: list[Batch] = []
        self.now = 0.0

    def submit(self, rid: str, prompt: list[int], max_tokens: int) -> Request:
        req = Request(
            rid,
            list(prompt),
            len(prompt),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            num_models=len(self.scheds),
        )
        self.scheds[0].add(req, self.now)
        return req

    def result_for(self, batch: Batch) -> StepResult:
        return StepResult([token_for(batch.model, i, r.start + r.num_tokens) for i, r in enumerate(batch.rows)])

    def deliver(self, actions) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.deliver(self.scheds[a.peer].resume(a.msg, self.now))
            elif isinstance(a, Emit):
                self.emitted.setdefault(a.rid, []).extend((a.pos + i, t, a.model) for i, t in enumerate(a.tokens))
            elif isinstance(a, Finish):
                self.finished[a.rid] = a.reason

    def step(self, model: int) -> Batch | None:
        s = self.scheds[model]
        batch = s.schedule(self.now)
        if batch is not None:
            self.batches.append(batch)
            self.now += 1.0
            self.deliver(s.complete(batch, self.result_for(batch), self.now))
        return batch

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            progressed = False
            for m in range(len(self.scheds)):
                progressed |= self.step(m) is not None
            if not progressed:
                return
        raise AssertionError("cluster did not go idle")


@pytest.fixture
def cluster_factory():
    return Cluster
