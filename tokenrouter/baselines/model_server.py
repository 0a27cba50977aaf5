"""One standard-serving model server (docs/baselines.md, section 2): the runtime's subserver with a one-model core
`Scheduler` and a prefix cache (`kv.PrefixCaching`), sized as the routed deployment's model."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import zmq

from tokenrouter.baselines.kv import PrefixCaching, RefCountedKVPool
from tokenrouter.core.batch import Batch
from tokenrouter.core.messages import Action, Emit, Finish
from tokenrouter.core.policy import Policy
from tokenrouter.core.request import ReqStatus, Request
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.deploy.builder import max_context_len
from tokenrouter.deploy.engine_args import engine_kwargs
from tokenrouter.deploy.kv_budget import kv_capacity_tokens
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.build import SubserverSpec, process_engine_kwargs
from tokenrouter.runtime.sockets import push_socket
from tokenrouter.runtime.subserver import Subserver, serve
from tokenrouter.runtime.supervision import start_child

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelServerSpec:
    """A subserver spec plus where answers go (`reply_to`: the dispatcher's or the front-end's PULL)."""

    sub: SubserverSpec
    reply_to: str


def build_server_part(spec: SubserverSpec) -> tuple[None, Scheduler, Any, PrefixCaching]:
    """Model `spec.model` as an independent one-model server, with the routed deployment's sizes."""
    from tokenrouter.engine import Engine, EngineConfig  # torch: in the model server's process only

    cfg, i = spec.config, spec.model
    sc, mc = cfg.scheduler, cfg.models[i]
    pool = RefCountedKVPool(kv_capacity_tokens(cfg, spec.memory_gb)[i] // sc.page_size + 1, sc.page_size)
    sched = Scheduler(0, 1, kv=pool, router=Router(), policy=Policy(), max_batch_size=sc.max_batch_size,
                      max_batch_tokens=sc.max_batch_tokens, overlap=cfg.overlaps(i),
                      graph_rule=mc.graph_rule(), max_context_len=max_context_len(cfg))  # fmt: skip
    kw = process_engine_kwargs(spec, engine_kwargs(cfg, i, pool.num_pages, spec.seed))
    kw["shared_pages"] = True
    engine = Engine(EngineConfig(**kw), kv_pool=pool)
    return None, sched, engine, PrefixCaching(pool)


class ModelServer(Subserver):
    caching: PrefixCaching  # set by `build`, before anything reads it

    def __init__(self, spec: ModelServerSpec) -> None:
        self.reply_to = spec.reply_to
        super().__init__(spec.sub)
        self.model = spec.sub.model  # the deployment's index (the one-model scheduler calls itself 0)

    def build(self, spec: SubserverSpec) -> tuple[Any, Any, Any]:
        dep, sched, engine, self.caching = build_server_part(spec)
        return dep, sched, engine

    def reply_socket(self, spec: SubserverSpec) -> zmq.Socket:
        return push_socket(self.ctx, self.reply_to)

    def after_add(self, req: Request) -> None:
        self.caching.admit(req)  # before the first `schedule`: the scheduler extends from the matched prefix

    def set_policy(self, msg: P.SetPolicy) -> None:
        err = "a standard-serving model server has no batching policy to change (it runs continuous batching)"
        self.front.send_multipart([P.CTL, P.encode(P.PolicySet(self.model, msg.seq, err))])

    def before_complete(self, batch: Batch) -> None:
        for row in batch.rows:
            req = row.req
            if row.version == req.version and req.status == ReqStatus.RUNNING:
                self.caching.cache(req, row.start + row.num_tokens)

    def deliver(self, acts: list[Action], failed: frozenset[str] = frozenset()) -> None:
        for a in acts:
            if isinstance(a, Finish):
                self.caching.finish(a.rid)
        # Emits carry the one-model scheduler's index 0: the answer names the deployment's model.
        super().deliver([replace(a, model=self.model) if isinstance(a, Emit) else a for a in acts], failed)

    def send_control(self, msg: P.Ready | P.Stats | P.Failed) -> None:
        if isinstance(msg, P.Stats):
            c = self.caching.counters
            msg = msgspec.structs.replace(msg, prefix_requests=c.requests, prefix_hits=c.hits,
                                          prefix_prompt_tokens=c.prompt_tokens, prefix_matched_tokens=c.matched_tokens,
                                          prefix_evicted_pages=c.evicted_pages, prefix_host_ms=c.host_s * 1e3,
                                          prefix_cached_pages=self.caching.cached_pages)  # fmt: skip
        super().send_control(msg)


def main(spec: ModelServerSpec) -> None:
    start_child(spec.sub.log_level, spec.sub.run_dir)
    serve(spec.sub, make=lambda sub, joined: ModelServer(spec))
