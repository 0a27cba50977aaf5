"""One subserver process: engine + core `Scheduler` + router, driven by `EngineLoop` over ZeroMQ (docs/runtime.md,
"The subserver loop"). `wait_idle` blocks on the PULL socket until a message, the policy deadline or the next
heartbeat: no spinning."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq

from tokenrouter.core import wire
from tokenrouter.core.batch import Batch
from tokenrouter.core.messages import Action, Emit, Finish, PeerReq, Send
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import RequestTooLong
from tokenrouter.engine.errors import EngineError
from tokenrouter.routers.presets import set_hop_rate
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import is_tcp
from tokenrouter.runtime.build import SubserverSpec, build_part, cpu_threads
from tokenrouter.runtime.engine_loop import EngineLoop
from tokenrouter.runtime.join import Joined, Left, join_launcher
from tokenrouter.runtime.logs import JsonlLog
from tokenrouter.runtime.sockets import drain, push_socket
from tokenrouter.runtime.supervision import fail_and_exit, start_child
from tokenrouter.runtime.sync_coordinator import RemoteGate
from tokenrouter.runtime.tp_ranks import TPRanks

STATS_MIN_GAP_S = 0.05  # Stats sent on a change: at most this often (the heartbeat still comes every interval)

log = logging.getLogger(__name__)


class Subserver(EngineLoop):
    def __init__(self, spec: SubserverSpec, joined: Joined | None = None) -> None:
        """`joined`: over tcp, the context and bound PULL socket of the join (`runtime.join`)."""
        t0 = time.monotonic()
        self.spec = spec
        addrs = spec.addresses
        self.ctx = zmq.Context() if joined is None else joined.ctx
        sync = spec.config.policy.is_sync
        self.gate = RemoteGate(spec.model, len(spec.config.models), addrs.coordinator, self.ctx) if sync else None
        mc = spec.config.models[spec.model]
        self.tag = f"model {spec.model} ({mc.name})"
        log.info("%s: loading %s on %s", self.tag, f"weights from {mc.path}" if mc.path else "dummy weights",
                 spec.device)  # fmt: skip
        self.dep, sched, engine = self.build(spec)
        super().__init__(engine, sched, prepare_margin_s=spec.prepare_margin_ms / 1000.0,
                         step_log=JsonlLog(spec.step_log))  # fmt: skip
        _log_start_phases(self.tag, self.engine, time.monotonic() - t0)
        if joined is None:
            self.pull = self.ctx.socket(zmq.PULL)
            self.pull.bind(addrs.bind(addrs.subservers[spec.model]))
        else:
            self.pull = joined.pull
        others = enumerate(addrs.subservers)
        self.peers: dict[int, zmq.Socket] = {j: push_socket(self.ctx, a) for j, a in others if j != spec.model}
        self.front = push_socket(self.ctx, addrs.frontend)
        self.out = self.reply_socket(spec)  # Tokens / Finished / Rejected go here
        self.launcher = push_socket(self.ctx, addrs.launcher) if addrs.launcher else None
        self.hops = JsonlLog(spec.hop_log)
        self.vocab = self.engine.spec.vocab_size
        # The core admits by this limit too: a request past it is rejected at submit, not by the engine's batch.
        context = min(self.engine.max_context_len, self.sched.max_context_len or self.engine.max_context_len)
        ready = P.Ready(spec.model, spec.config.models[spec.model].name, self.sched.kv.capacity_tokens,
                        context, self.vocab, time.monotonic() - t0)  # fmt: skip
        self.send_control(ready)
        log.info("%s: ready in %.1f s (context %d tokens, pid %d)", self.tag, ready.startup_s, context, os.getpid())
        self.next_stats, self.stats_sent = 0.0, float("-inf")
        self.stats_sig: tuple[int, ...] = ()

    # ---- hooks (`baselines.model_server` overrides them) ----------------------------------------------------
    def build(self, spec: SubserverSpec) -> tuple[Any, Any, Any]:
        """(deployment, this model's scheduler, its engine on the scheduler's pool), before the sockets open."""
        return build_part(spec, self.gate)

    def reply_socket(self, spec: SubserverSpec) -> zmq.Socket:
        """Where a request's tokens and its end go: the front-end here."""
        return self.front

    def send_control(self, msg: P.Ready | P.Stats | P.Failed) -> None:
        """Every Ready/Stats/Failed of this process goes out here, to the front-end and the launcher."""
        data = P.encode(msg)
        self.front.send_multipart([P.CTL, data])
        if self.launcher is not None:
            self.launcher.send_multipart([P.CTL, data])

    def _on_message(self, chan: bytes, data: bytes, now: float) -> None:
        if chan == P.PEER:
            self.deliver(self.sched.resume(wire.decode(data), now))
        elif chan == P.CTL:
            msg = P.decode_for_subserver(data)
            if isinstance(msg, P.Submit):
                self.submit(msg, now)
            elif isinstance(msg, P.Abort):
                self.deliver(self.sched.abort(msg.rid, now))
            elif isinstance(msg, P.Shutdown):
                self.stopping = True
            elif isinstance(msg, P.Restarted):
                self._on_peer_restarted(msg.model, now)
            elif isinstance(msg, P.SetPolicy):
                self.set_policy(msg)
        elif chan == P.GATE and self.gate is not None:
            self.gate.on_grant(data)  # a grant: the loop asks `schedule` next

    def submit(self, msg: P.Submit, now: float) -> None:
        """Add a client's request (then `after_add`), or answer `Rejected` (400) when it cannot be served."""
        try:
            req = self.request_from(msg)
            acts = self.sched.add(req, now)
        except (RequestTooLong, ValueError, TypeError) as e:
            self.out.send_multipart([P.CTL, P.encode(P.Rejected(msg.rid, 400, str(e)))])
            return
        self.after_add(req)
        self.hops.write({"rid": msg.rid, "prompt_len": req.prompt_len})
        self.deliver(acts)

    def after_add(self, req: Request) -> None:
        """`req` was just added to the scheduler; its first `schedule` comes later."""

    def request_from(self, msg: P.Submit) -> Request:
        """The core request of a submission; ValueError/TypeError for what the front-end could not check."""
        ids = P.unpack_ids(msg.prompt_ids)
        if not ids:
            raise ValueError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} out of the vocabulary (0..{self.vocab - 1})")
        sp = SamplingParams(**{f: getattr(msg.sampling, f) for f in msg.sampling.__struct_fields__})
        return Request(msg.rid, ids, len(ids), sp, num_models=self.sched.num_models, entry=self.sched.entry,
                       eos_token_ids=tuple(msg.eos_token_ids))  # fmt: skip

    def set_policy(self, msg: P.SetPolicy) -> None:
        """Apply the admin endpoint's policy (and hop rate), all or nothing, and acknowledge with one `PolicySet`."""
        error = None
        try:
            pc = msg.policy
            old = self.sched.policy
            self.sched.set_policy(pc.build())
            if msg.hop_rate is not None:
                rc = self.spec.config.router
                try:
                    set_hop_rate(self.sched.router, rc.name, msg.hop_rate, rc.return_prob)
                except ValueError:
                    self.sched.set_policy(old)  # all or nothing
                    raise
            log.info("%s: policy %s thresholds %s%s (%d requests live)", self.tag, pc.kind,
                     pc.thresholds or pc.table or "-", "" if msg.hop_rate is None else f", hop rate {msg.hop_rate}",
                     self.sched.active)  # fmt: skip
        except ValueError as e:
            error = str(e)
        self.front.send_multipart([P.CTL, P.encode(P.PolicySet(self.model, msg.seq, error))])

    def _on_peer_restarted(self, peer: int, now: float) -> None:
        """A peer restarts empty: drop every request and reconnect, so nothing queued for the dead one reaches it."""
        if peer in self.peers:
            self.peers[peer].close(linger=0)
            self.peers[peer] = push_socket(self.ctx, self.spec.addresses.subservers[peer])
        acts = self.sched.on_peer_restart(peer, now)
        log.warning("%s: model %d restarts: %d requests here dropped", self.tag, peer,
                    sum(isinstance(a, Finish) for a in acts))  # fmt: skip
        self.deliver(acts)

    def _drain(self, timeout_ms: int) -> None:
        for chan, data in drain(self.pull, timeout_ms):
            self._on_message(chan, data, time.monotonic())

    def receive(self, timeout_s: float) -> None:
        self._stats(time.monotonic())  # sends only on the heartbeat or soon after a change
        self._drain(int(timeout_s * 1000))

    def wait_idle(self) -> None:
        now = time.monotonic()
        self._stats(now)
        self._drain(self._timeout_ms(now))

    def after_schedule(self, batch: Batch | None) -> None:
        if self.gate is not None:
            self.gate.after_schedule(batch is not None)  # hands back a grant that finds nothing to run

    def deliver(self, acts: list[Action], failed: frozenset[str] = frozenset()) -> None:
        for a in acts:
            if isinstance(a, Send):
                if isinstance(a.msg, PeerReq) and not a.msg.finished:
                    self.counters.hops += 1
                self.peers[a.peer].send_multipart([P.PEER, wire.encode(a.msg)])
            elif isinstance(a, Emit):
                self.counters.tokens += len(a.tokens)
                out = P.Tokens(a.rid, a.pos, P.pack_ids(a.tokens), a.model, a.logprobs)
                self.out.send_multipart([P.CTL, P.encode(out)])
                self.hops.write({"rid": a.rid, "pos": a.pos, "n": len(a.tokens), "model": a.model})
            elif isinstance(a, Finish):
                reason = "error" if a.rid in failed else a.reason
                self.out.send_multipart([P.CTL, P.encode(P.Finished(a.rid, reason, a.num_output, a.num_hops))])
        if self.gate is not None:
            self.gate.flush()  # after the peer messages, so a granted peer need not wait for them

    def _timeout_ms(self, now: float) -> int:
        deadline = self.sched.next_deadline()
        wake = self.next_stats if deadline is None else min(self.next_stats, deadline)
        return max(0, int((wake - now) * 1000) + 1)

    def _stats(self, now: float, force: bool = False) -> None:
        """Send `Stats` on the heartbeat and, at most every `STATS_MIN_GAP_S`, soon after the state changes, so the
        front-end's gauges follow a change. Cheap when nothing is sent: the change test reads sizes only."""
        kv = self.sched.kv
        s = self.sched
        sig = (kv.num_free, len(s.waiting), len(s.admit_queue), len(s.reqs), s.step_id, self.counters.steps)
        if sig != self.stats_sig:
            self.stats_sig = sig
            self.next_stats = min(self.next_stats, self.stats_sent + STATS_MIN_GAP_S)
        if not force and now < self.next_stats:
            return
        pending = sum(1 for r in s.reqs.values() if r.status.name == "PENDING")
        running = sum(1 for r in s.reqs.values() if r.status.name == "RUNNING")
        c = self.counters
        self.send_control(P.Stats(self.model, now, kv.num_pages - 1 - kv.num_free, kv.num_pages - 1, running,
                              len(s.waiting) + len(s.admit_queue), pending, c.steps, c.rows, c.step_ms, c.tokens,
                              c.hops, c.loop_steps, c.loop_rows, c.loop_ms, c.loop_gpu_ms, c.busy_ms,
                              batch_steps=list(c.batches.steps), batch_rows=list(c.batches.rows),
                              batch_ms=list(c.batches.ms), live=s.active))  # fmt: skip
        self.stats_sent = now
        self.next_stats = now + self.spec.stats_interval_s

    def run(self, max_steps: int | None = None) -> None:
        try:
            super().run(max_steps)
        except EngineError:
            followers = getattr(self.engine, "followers", None)
            if isinstance(followers, TPRanks):
                followers.await_death(timeout_s=5.0)
            raise
        self._stats(time.monotonic(), force=True)

    def close(self) -> None:
        self.hops.close()
        self.step_log.close()
        if self.gate is not None:
            self.gate.close()
        self.engine.close()
        self.ctx.destroy(linger=2000)


def _log_start_phases(tag: str, engine: Any, total_s: float) -> None:
    """One line per start-up phase, from what the engine measured while it was built."""
    rep = engine.memory_report()
    cap = engine.capture_stats
    graphs_s, warm_s = float(cap.get("capture_s", 0.0)), float(getattr(engine, "warmup_s", 0.0))
    load_s = max(0.0, total_s - graphs_s - warm_s)
    log.info("%s: weights %s loaded, KV cache %d tokens (%d pages of %d, %s) in %.1f s", tag, _size(rep.weights),
             engine.kv_pool.capacity_tokens, rep.num_pages, engine.kv_pool.page_size, _size(rep.kv_cache),
             load_s)  # fmt: skip
    if rep.decode_graphs or rep.varlen_graphs:
        log.info("%s: %d decode + %d varlen CUDA graphs captured in %.1f s", tag, rep.decode_graphs,
                 rep.varlen_graphs, graphs_s)  # fmt: skip
    else:
        log.info("%s: no CUDA graphs (eager steps)", tag)
    if warm_s:
        log.info("%s: kernels warmed up in %.1f s", tag, warm_s)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def main(spec: SubserverSpec) -> None:
    start_child(spec.log_level, spec.run_dir)
    serve(spec)


def serve(spec: SubserverSpec, joined: Joined | None = None, *, watch_launcher: bool = False,
          make: Callable[[SubserverSpec, Joined | None], Subserver] = Subserver) -> None:  # fmt: skip
    """Run `make(spec, joined)` until `Shutdown`, first joining the launcher over tcp unless `joined`;
    `watch_launcher`: exit when the link to the launcher drops. On an error: `Failed`, then `os._exit(1)`."""
    sub: Subserver | None = None
    try:
        if spec.device == "cpu" and (threads := cpu_threads(len(spec.config.models))) is not None:
            from tokenrouter.engine.host_threads import set_intra_op_threads  # torch: before this process's engine

            set_intra_op_threads(threads)
        if joined is None and is_tcp(spec.addresses.launcher):
            joined = join_launcher(spec.addresses, spec.model, spec.config.models[spec.model].name)
            if joined is None:
                return  # the launcher stopped before we were welcomed
            spec = replace(spec, addresses=joined.welcome.addresses)  # the published table; it knows the rest
        if joined is not None and watch_launcher:
            joined.link.watch(lambda: _launcher_lost(spec.model, joined.link.address))
        sub = make(spec, joined)
        sub.run()
    except BaseException as e:
        fail_and_exit(spec.addresses, spec.model, e, sub.send_control if sub is not None else None)
    if joined is not None:
        joined.link.send(Left(spec.model))
    sub.close()
    if joined is not None:
        joined.link.close()


def _launcher_lost(model: int, address: str) -> None:
    log.error("model %d: lost the launcher at %s: exiting", model, address)
    os._exit(1)
