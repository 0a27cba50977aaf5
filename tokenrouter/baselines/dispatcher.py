"""The standard-serving dispatcher: the client-side router token-level routing needs on top of stock servers
(docs/baselines.md, section 2). Each visit sends a model the whole sequence with a planned `max_tokens`
(`run_plan.plan_run`); a committed token that stops the request ends it before any hop."""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from tokenrouter.baselines.run_plan import RunPlan, check_router, plan_run
from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.deploy.builder import build_router
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.logs import JsonlLog
from tokenrouter.runtime.sockets import drain, push_socket
from tokenrouter.runtime.supervision import start_child

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DispatcherSpec:
    config: DeploymentConfig
    addresses: Any  # runtime.addresses.Addresses: `submit` is ours, `subservers` the model servers, `frontend`
    seed: int = 0
    log_level: int = 30
    hop_log: str | None = None
    trace_log: str | None = None
    run_dir: str | None = None


@dataclass(slots=True)
class Flow:
    """One client request: `req` holds the prompt and the committed output as the dispatcher knows them."""

    req: Request
    sampling: Any  # P.Sampling: what the client asked, sent again with each visit's max_tokens
    model: int
    plan: RunPlan
    visit: int = 0
    num_hops: int = 0
    got: dict[int, tuple[int, TokenLogprobs | None]] = field(default_factory=dict)  # this visit's tokens by position
    received: int = 0  # this visit's tokens handled, in order
    prefix: int = 0  # tokens the visit carried (prompt + committed output when it was sent)
    sent_at: float = 0.0
    first_at: float | None = None

    @property
    def visit_rid(self) -> str:
        return f"{self.req.rid}/{self.visit}"


def build_routers(cfg: DeploymentConfig, seed: int) -> list[Any]:
    """One router per model, bound as each routed subserver binds its own (ProbRouter: stream (seed, model))."""
    if cfg.router.weights:
        raise ValueError(f"router {cfg.router.name!r} with weights {cfg.router.weights!r} is a learned router: it "
                         "reads the model's outputs, which a standard server does not return; std-serving runs the "
                         "synthetic routers only")  # fmt: skip
    m = len(cfg.models)
    out = [build_router(cfg.router, m, seed).bind(i, m) for i in range(m)]
    for r in out:
        check_router(r, str(cfg.router.name))
    return out


class Dispatcher:
    def __init__(self, spec: DispatcherSpec) -> None:
        self.spec = spec
        cfg = spec.config
        self.entry = cfg.entry
        self.routers = build_routers(cfg, spec.seed)
        addrs = spec.addresses
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(addrs.bind(addrs.submit))
        self.servers = [push_socket(self.ctx, a) for a in addrs.subservers]
        self.front = push_socket(self.ctx, addrs.frontend)
        self.flows: dict[str, Flow] = {}
        self.by_visit: dict[str, Flow] = {}
        self.hop_log = JsonlLog(spec.hop_log)
        self.trace = JsonlLog(spec.trace_log)
        self.dec = msgspec.msgpack.Decoder(P.ToSubserver | P.ToFrontend)
        self.stopping = False

    def _to_front(self, msg: P.ToFrontend) -> None:
        self.front.send_multipart([P.CTL, P.encode(msg)])

    def run(self) -> None:
        while not self.stopping:
            for chan, data in drain(self.pull, 200):
                if chan == P.CTL:
                    self.handle(self.dec.decode(data), time.monotonic())

    def handle(self, msg: Any, now: float) -> None:
        if isinstance(msg, P.Submit):
            self._submit(msg, now)
        elif isinstance(msg, P.Abort):
            self._abort(msg.rid)
        elif isinstance(msg, P.Tokens):
            self._tokens(msg, now)
        elif isinstance(msg, P.Finished):
            self._visit_done(msg, now)
        elif isinstance(msg, P.Rejected):
            self._rejected(msg)
        elif isinstance(msg, P.Shutdown):
            self.stopping = True

    def _submit(self, msg: P.Submit, now: float) -> None:
        if msg.rid in self.flows:
            self._to_front(P.Rejected(msg.rid, 400, f"duplicate request id {msg.rid!r}"))
            return
        ids = P.unpack_ids(msg.prompt_ids)
        try:
            if not ids:
                raise ValueError("empty prompt")
            sp = SamplingParams(**{f: getattr(msg.sampling, f) for f in msg.sampling.__struct_fields__})
        except (ValueError, TypeError) as e:
            self._to_front(P.Rejected(msg.rid, 400, str(e)))
            return
        m = len(self.routers)
        req = Request(msg.rid, ids, len(ids), sp, num_models=m, entry=self.entry,
                      eos_token_ids=tuple(msg.eos_token_ids))  # fmt: skip
        flow = Flow(req, msg.sampling, self.entry, plan_run(self.routers[self.entry], req, self.entry))
        self.flows[req.rid] = flow
        self.trace.write({"rid": req.rid, "prompt_len": len(ids)})
        self._send_visit(flow, now)

    def _abort(self, rid: str) -> None:
        flow = self.flows.pop(rid, None)
        if flow is None:
            return
        self.by_visit.pop(flow.visit_rid, None)
        self.servers[flow.model].send_multipart([P.CTL, P.encode(P.Abort(flow.visit_rid))])
        self._to_front(P.Finished(rid, "abort", flow.req.num_output, flow.num_hops))

    def _send_visit(self, flow: Flow, now: float) -> None:
        flow.got.clear()
        flow.received = 0
        flow.sent_at, flow.first_at = now, None
        flow.prefix = len(flow.req.token_ids)
        self.by_visit[flow.visit_rid] = flow
        sampling = msgspec.structs.replace(flow.sampling, max_tokens=flow.plan.tokens)
        submit = P.Submit(flow.visit_rid, P.pack_ids(flow.req.token_ids), sampling, flow.req.eos_token_ids)
        self.servers[flow.model].send_multipart([P.CTL, P.encode(submit)])

    def _tokens(self, msg: P.Tokens, now: float) -> None:
        flow = self.by_visit.get(msg.rid)
        if flow is None:
            return  # the client left; the visit's end is on its way
        if flow.first_at is None:
            flow.first_at = now
        lps = msg.logprobs or []
        for k, tok in enumerate(P.unpack_ids(msg.ids)):
            flow.got[msg.pos + k] = (tok, lps[k] if k < len(lps) else None)
        last = flow.plan.tokens - 1
        while flow.received in flow.got:
            pos = flow.received
            tok, lp = flow.got.pop(pos)
            flow.received += 1
            if pos == last and not flow.plan.keep_last:
                continue  # the hop's dropped token: the next model writes this position
            req = flow.req
            req.token_ids.append(tok)
            out_pos = req.num_output - 1
            self._to_front(P.Tokens(req.rid, out_pos, P.pack_ids([tok]), flow.model,
                                    [lp] if msg.logprobs is not None else None))  # fmt: skip
            self.trace.write({"rid": req.rid, "pos": out_pos, "n": 1, "model": flow.model})

    def _visit_done(self, msg: P.Finished, now: float) -> None:
        flow = self.by_visit.pop(msg.rid, None)
        if flow is None:
            return
        req, plan = flow.req, flow.plan
        self.hop_log.write({"rid": req.rid, "visit": flow.visit, "model": flow.model, "prefix": flow.prefix,
                            "tokens": plan.tokens, "received": flow.received, "send": flow.sent_at,
                            "first": flow.first_at, "done": now})  # fmt: skip
        if msg.reason not in ("stop", "length") or flow.received != msg.num_output:  # an error, or tokens lost
            self._end(flow, msg.reason if msg.reason in ("abort", "error") else "error")
            return
        if flow.received < plan.tokens:
            self._end(flow, "stop")  # a committed stop token before the planned end
            return
        if plan.keep_last:
            reason = req.stop_reason()  # the routed scheduler checks the committed token before any hop
            if reason is not None:
                self._end(flow, reason)
                return
            if plan.dst == flow.model:
                self._end(flow, "length")  # planned up to max_tokens, which stop_reason saw; kept for safety
                return
        flow.model = plan.dst  # hop: the next visit goes to the model the router named
        if plan.dst != self.entry:
            flow.num_hops += 1
        flow.visit += 1
        flow.plan = plan_run(self.routers[plan.dst], req, plan.dst)
        self._send_visit(flow, now)

    def _rejected(self, msg: P.Rejected) -> None:
        flow = self.by_visit.pop(msg.rid, None)
        if flow is None:
            return
        if flow.visit == 0 and flow.req.num_output == 0:
            self.flows.pop(flow.req.rid, None)
            self._to_front(P.Rejected(flow.req.rid, msg.status, msg.message))
        else:
            log.error("%s: visit %d to model %d rejected: %s", flow.req.rid, flow.visit, flow.model, msg.message)
            self._end(flow, "error")

    def _end(self, flow: Flow, reason: str) -> None:
        self.flows.pop(flow.req.rid, None)
        self._to_front(P.Finished(flow.req.rid, reason, flow.req.num_output, flow.num_hops))

    def close(self) -> None:
        self.hop_log.close()
        self.trace.close()
        self.ctx.destroy(linger=2000)


def main(spec: DispatcherSpec) -> None:
    start_child(spec.log_level)
    d: Dispatcher | None = None
    try:
        d = Dispatcher(spec)
        d.run()
    except BaseException as e:
        log.error("std-serving dispatcher: %s: %s", type(e).__name__, e)
        traceback.print_exc()
        os._exit(1)
    d.close()
