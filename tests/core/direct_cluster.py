"""A small synchronous driver for scheduler unit tests: schedulers in one process, messages delivered at once
(through the wire encoding, as the runtime does), tokens from an executor that depends on what it was fed.
`tests/core/cluster.py` is the realistic one (delays, reordering, invariants after every step).

A plain module, not `conftest.py`: every test directory's `conftest` is imported under that one name, so
`from conftest import ...` picks whichever directory pytest collected last."""

from __future__ import annotations

from fakes import FakeExecutor, ScriptedRouter

from tokenrouter.core import wire
from tokenrouter.core.admission import Admission
from tokenrouter.core.batch import Batch
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Emit, Finish, Send
from tokenrouter.core.policy import Policy, SyncGate
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import Scheduler


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
        admission: bool = False,
    ) -> None:
        policy = policy or Policy()
        gate = SyncGate(policy.kind, num_models) if policy.is_sync else None
        script = router_script if router_script is not None else {}
        pools = [KVPool(pages, page_size) for _ in range(num_models)]
        adm = Admission([_size(p) for p in pools]) if admission else None
        self.scheds = [
            Scheduler(
                m,
                num_models,
                kv=pools[m],
                router=ScriptedRouter(script),
                policy=policy,
                gate=gate,
                overlap=overlap,
                admission=adm if m == 0 else None,
            )
            for m in range(num_models)
        ]
        self.executors = [FakeExecutor(m) for m in range(num_models)]
        self.emitted: dict[str, list[tuple[int, int, int]]] = {}
        self.finished: dict[str, str] = {}
        self.batches: list[Batch] = []
        self.prompts: dict[str, list[int]] = {}
        self.now = 0.0

    def submit(self, rid: str, prompt: list[int], max_tokens: int) -> Request:
        req = Request(
            rid,
            list(prompt),
            len(prompt),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            num_models=len(self.scheds),
        )
        self.prompts[rid] = list(prompt)
        self.deliver(self.scheds[0].add(req, self.now))
        return req

    def result_for(self, batch: Batch):
        return self.executors[batch.model].run(batch)

    def deliver(self, actions) -> None:
        for a in actions:
            if isinstance(a, Send):
                msg = wire.decode(wire.encode(a.msg))
                self.deliver(self.scheds[a.peer].resume(msg, self.now))
            elif isinstance(a, Emit):
                self.emitted.setdefault(a.rid, []).extend((a.pos + i, t, a.model) for i, t in enumerate(a.tokens))
            elif isinstance(a, Finish):
                self.finished[a.rid] = a.reason

    def step(self, model: int) -> Batch | None:
        s = self.scheds[model]
        batch = s.schedule(self.now)
        if batch is not None:
            self.batches.append(batch)
            result = self.result_for(batch)
            self.now += 1.0
            self.deliver(s.complete(batch, result, self.now))
        return batch

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            progressed = False
            for m in range(len(self.scheds)):
                progressed |= self.step(m) is not None
            if not progressed:
                return
        raise AssertionError("cluster did not go idle")


def _size(pool: KVPool):
    from tokenrouter.core.admission import PoolSize

    return PoolSize(pool.num_pages - 1, pool.page_size)
