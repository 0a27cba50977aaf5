"""One subserver process: engine + core `Scheduler` + router, driven by a ZeroMQ event loop.

Loop (the core's driver contract, `core.scheduler`): drain every queued message (Submit -> `add`, Abort ->
`abort`, PEER -> `resume`, GATE -> just re-ask), then `schedule(now)` -> `engine.step` -> `complete` ->
deliver actions (Send -> peer PUSH as `core.wire`, Emit -> `Tokens`, Finish -> `Finished`). Overlap is the
`EngineLoop`'s: with `sched.overlap` step k+1 is launched before step k is completed. When nothing runs and
`schedule` says wait, the loop blocks in `zmq.Poller.poll` until a message, the policy deadline
(`next_deadline`) or the next Stats heartbeat: no busy spinning.

The loop never frees KV itself: a hopped request stays PENDING with its pages in the scheduler until the core
finishes or aborts it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import deque
from typing import Any

import zmq

from tokenrouter.core import wire
from tokenrouter.core.batch import StepResult
from tokenrouter.core.messages import Action, Emit, Finish, PeerReq, Send
from tokenrouter.core.overlap import prepare_time
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import RequestTooLong
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.build import SubserverSpec, build_part
from tokenrouter.runtime.gate import RemoteGate
from tokenrouter.runtime.logs import JsonlLog, configure_logging
from tokenrouter.runtime.parent_watch import die_with_parent
from tokenrouter.runtime.stats import Counters
from tokenrouter.runtime.step_clock import StepClock

log = logging.getLogger(__name__)


class Subserver:
    def __init__(self, spec: SubserverSpec) -> None:
        t0 = time.monotonic()
        self.spec = spec
        self.model = spec.model
        addrs = spec.addresses
        self.ctx = zmq.Context()
        self.gate: RemoteGate | None = None
        if spec.config.policy.build().is_sync:
            self.gate = RemoteGate(spec.model, addrs.coordinator, self.ctx)
        mc = spec.config.models[spec.model]
        self.tag = f"model {spec.model} ({mc.name})"
        log.info("%s: loading %s on %s", self.tag, f"weights from {mc.path}" if mc.path else "dummy weights",
                 spec.device)  # fmt: skip
        self.dep, self.sched, self.engine = build_part(spec, self.gate)
        _log_start_phases(self.tag, self.engine, time.monotonic() - t0)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(addrs.subservers[spec.model])
        self.peers: dict[int, zmq.Socket] = {}
        for j, a in enumerate(addrs.subservers):
            if j != spec.model:
                self.peers[j] = self._push(a)
        self.front = self._push(addrs.frontend)
        self.launcher = self._push(addrs.launcher) if addrs.launcher else None
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.inflight: deque[tuple[Any, Any, float, bool]] = deque()  # (batch, handle, launch time, back to back)
        self.counters = Counters()
        # GPU time per step (two CUDA events) for the loop-overhead counters; nothing to time on CPU.
        self.engine.timing = self.engine.device.type == "cuda"
        self.idled = True  # the loop offered to block since the last launch: the next step is not back to back
        self.last_done: float | None = None
        self.clock = StepClock()
        self.margin_s = spec.prepare_margin_ms / 1000.0
        self.hops = JsonlLog(spec.hop_log)
        self.steps = JsonlLog(spec.step_log)
        self.stopping = False
        self.vocab = self.engine.spec.vocab_size
        # The core admits by this limit too (`Scheduler.max_context_len`): a request past it is rejected at
        # submit instead of reaching the engine, which would refuse the whole batch.
        context = min(self.engine.max_context_len, self.sched.max_context_len or self.engine.max_context_len)
        ready = P.Ready(spec.model, spec.config.models[spec.model].name, self.sched.kv.capacity_tokens,
                        context, self.vocab, time.monotonic() - t0)  # fmt: skip
        self._control(ready)
        log.info("%s: ready in %.1f s (context %d tokens, pid %d)", self.tag, ready.startup_s, context, os.getpid())
        self.next_stats = 0.0

    def _push(self, addr: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, 0)
        s.connect(addr)
        return s

    def _control(self, msg: P.Ready | P.Stats | P.Failed) -> None:
        data = P.encode(msg)
        self.front.send_multipart([P.CTL, data])
        if self.launcher is not None:
            self.launcher.send_multipart([P.CTL, data])

    # ---- inputs ---------------------------------------------------------------------------------------
    def _on_message(self, chan: bytes, data: bytes, now: float) -> None:
        if chan == P.PEER:
            self._deliver(self.sched.resume(wire.decode(data), now))
        elif chan == P.CTL:
            msg = P.decode_for_subserver(data)
            if isinstance(msg, P.Submit):
                self._submit(msg, now)
            elif isinstance(msg, P.Abort):
                self._deliver(self.sched.abort(msg.rid, now))
            elif isinstance(msg, P.Shutdown):
                self.stopping = True
            elif isinstance(msg, P.Restarted):
                self._on_peer_restarted(msg.model, now)
        # GATE: nothing to do; the loop re-asks schedule.

    def _submit(self, msg: P.Submit, now: float) -> None:
        ids = P.unpack_ids(msg.prompt_ids)
        try:
            if not ids:
                raise ValueError("empty prompt")
            bad = [t for t in ids if not 0 <= t < self.vocab]
            if bad:
                raise ValueError(f"token id {bad[0]} out of the vocabulary (0..{self.vocab - 1})")
            sp = SamplingParams(**{f: getattr(msg.sampling, f) for f in msg.sampling.__struct_fields__})
            req = Request(msg.rid, ids, len(ids), sp, num_models=self.dep.num_models, entry=self.sched.entry,
                          eos_token_ids=tuple(msg.eos_token_ids))  # fmt: skip
            acts = self.sched.add(req, now)
        except (RequestTooLong, ValueError, TypeError) as e:
            self.front.send_multipart([P.CTL, P.encode(P.Rejected(msg.rid, 400, str(e)))])
            return
        self.hops.write({"rid": msg.rid, "prompt_len": len(ids)})
        self._deliver(acts)

    def _on_peer_restarted(self, peer: int, now: float) -> None:
        """A peer died and is being restarted empty: drop every request (the core's rule), and reconnect to
        it so nothing queued for the dead process reaches the new one."""
        if peer in self.peers:
            self.peers[peer].close(linger=0)
            self.peers[peer] = self._push(self.spec.addresses.subservers[peer])
        acts = self.sched.on_peer_restart(peer, now)
        log.warning("%s: model %d restarts: %d requests here dropped", self.tag, peer,
                    sum(isinstance(a, Finish) for a in acts))  # fmt: skip
        self._deliver(acts)

    def _drain(self, timeout_ms: int) -> None:
        """Handle every queued message; wait up to `timeout_ms` for the first one."""
        events = self.poller.poll(timeout_ms)
        while events:
            now = time.monotonic()
            chan, data = self.pull.recv_multipart()
            self._on_message(chan, data, now)
            events = self.poller.poll(0)

    # ---- outputs --------------------------------------------------------------------------------------
    def _deliver(self, acts: list[Action], error_rids: frozenset[str] = frozenset()) -> None:
        if self.gate is not None:
            self.gate.flush()  # before any Send leaves: the coordinator counts the send first
        for a in acts:
            if isinstance(a, Send):
                if isinstance(a.msg, PeerReq) and not a.msg.finished:
                    self.counters.hops += 1
                self.peers[a.peer].send_multipart([P.PEER, wire.encode(a.msg)])
            elif isinstance(a, Emit):
                self.counters.tokens += len(a.tokens)
                out = P.Tokens(a.rid, a.pos, P.pack_ids(a.tokens), a.model)
                self.front.send_multipart([P.CTL, P.encode(out)])
                self.hops.write({"rid": a.rid, "pos": a.pos, "n": len(a.tokens), "model": a.model})
            elif isinstance(a, Finish):
                reason = "error" if a.rid in error_rids else a.reason
                self.front.send_multipart([P.CTL, P.encode(P.Finished(a.rid, reason, a.num_output, a.num_hops))])

    # ---- steps ----------------------------------------------------------------------------------------
    def _launch(self, now: float) -> bool:
        batch = self.sched.schedule(now)
        if batch is None:
            if self.gate is not None:
                self.gate.release()
            return False
        from tokenrouter.engine.errors import StepFailed

        r = self.sched.router
        try:
            handle = self.engine.step(batch, return_logits=r.needs_logits, return_hidden=r.needs_hidden)
        except StepFailed as e:
            self._fail_batch(batch, str(e))
            return True
        t = time.monotonic()
        self.clock.on_launch(t)
        self.inflight.append((batch, handle, t, not self.idled))
        self.idled = False
        return True

    def _fail_batch(self, batch: Any, why: str) -> None:
        """A launch failed: its requests end with "error" (and are dropped on every peer); the loop goes on."""
        print(f"subserver {self.model}: {why}", file=sys.stderr)
        rids = frozenset(row.req.rid for row in batch.rows)
        acts: list[Action] = []
        for rid in rids:
            acts += self.sched.abort(rid, time.monotonic())
        # Every row is now stale, so completing the batch only takes it off the in-flight list.
        acts += self.sched.complete(batch, StepResult(next_token_ids=[-1] * len(batch.rows)), time.monotonic())
        self._deliver(acts, rids)

    def _complete_oldest(self) -> None:
        batch, handle, t_launch, back_to_back = self.inflight.popleft()
        res = handle.result()
        t_done = time.monotonic()
        rows = len(batch.rows)
        self.counters.step(rows, t_done - t_launch)
        gpu_ms = handle.gpu_start.elapsed_time(handle.gpu_end) if handle.gpu_start is not None else 0.0
        self.clock.on_gpu_time(gpu_ms / 1000.0)
        self.clock.on_complete(t_done, bool(self.inflight))
        if back_to_back and self.last_done is not None:
            self.counters.loop_step(rows, t_done - self.last_done, gpu_ms)
        self.last_done = t_done
        self.steps.write({"model": self.model, "step": batch.step_id, "rows": rows, "launch": t_launch,
                          "done": t_done, "gpu_ms": gpu_ms, "back_to_back": back_to_back})  # fmt: skip
        self._deliver(self.sched.complete(batch, res, t_done))

    def _wait_to_prepare(self) -> None:
        """Overlap: form step k+1 `prepare_margin_ms` before step k is estimated to end (`core.overlap`), taking
        peers' messages meanwhile, so returns that land during k join k+1 as in the simulator. Stops waiting
        as soon as k is done (the estimate was long) or the estimate runs out."""
        if not self.sched.overlap or self.gate is not None or len(self.inflight) != 1 or self.clock.end is None:
            return
        handle = self.inflight[0][1]
        at = prepare_time(self.clock.end, self.margin_s)
        while not self.stopping and not handle.ready():
            left = at - time.monotonic()
            if left <= 0:
                return
            self._drain(min(2, int(left * 1000)))  # 2 ms slices: notice an early end of k soon enough

    def _timeout_ms(self, now: float) -> int:
        wake = self.next_stats
        deadline = self.sched.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        return max(0, int((wake - now) * 1000) + 1)

    def _stats(self, now: float) -> None:
        kv = self.sched.kv
        s = self.sched
        pending = sum(1 for r in s.reqs.values() if r.status.name == "PENDING")
        running = sum(1 for r in s.reqs.values() if r.status.name == "RUNNING")
        c = self.counters
        self._control(P.Stats(self.model, now, kv.num_pages - 1 - kv.num_free, kv.num_pages - 1, running,
                              len(s.waiting) + len(s.admit_queue), pending, c.steps, c.rows, c.step_ms, c.tokens,
                              c.hops, c.loop_steps, c.loop_rows, c.loop_ms, c.loop_gpu_ms))  # fmt: skip
        self.next_stats = now + self.spec.stats_interval_s

    def run(self) -> None:
        busy = False
        while not self.stopping:
            now = time.monotonic()
            if now >= self.next_stats:
                self._stats(now)
            idle = not busy and not self.inflight
            self.idled |= idle
            self._drain(self._timeout_ms(now) if idle else 0)
            self._wait_to_prepare()
            if self.stopping:
                break
            launched = self._launch(time.monotonic())
            completed = False
            while self.inflight and (not self.sched.overlap or not launched or len(self.inflight) > 1):
                self._complete_oldest()
                completed = True
            # A completion can make this model launchable again (its requeued rows, a sync gate's next round)
            # without any message arriving: ask `schedule` once more before blocking in the poll.
            busy = launched or completed or bool(self.inflight)
        while self.inflight:
            self._complete_oldest()
        self._stats(time.monotonic())

    def close(self) -> None:
        self.hops.close()
        self.steps.close()
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


def _remove_orphaned_run_dir(run_dir: str | None) -> None:
    from pathlib import Path

    from tokenrouter.runtime import rundir

    if run_dir and rundir.owner_gone(Path(run_dir)):
        rundir.remove(Path(run_dir))


def main(spec: SubserverSpec) -> None:
    """Process entry point (multiprocessing spawn target). Exits non-zero after sending `Failed` on an error;
    exits at once (removing the run directory) when the server process is gone."""
    configure_logging(spec.log_level)
    parent = mp.parent_process()
    die_with_parent(parent.pid if parent is not None else os.getppid(),
                    lambda: _remove_orphaned_run_dir(spec.run_dir))  # fmt: skip
    sub: Subserver | None = None
    try:
        sub = Subserver(spec)
        sub.run()
    except BaseException as e:
        msg = f"{type(e).__name__}: {e}"
        log.error("model %d: %s", spec.model, msg)
        traceback.print_exc()
        try:
            if sub is not None:
                sub._control(P.Failed(spec.model, msg))
            else:
                _report_failed(spec, msg)
        finally:
            os._exit(1)
    sub.close()


def _report_failed(spec: SubserverSpec, msg: str) -> None:
    """`Failed` from a subserver that died during start-up (no sockets yet)."""
    ctx = zmq.Context()
    for addr in (spec.addresses.frontend, spec.addresses.launcher):
        if addr:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 2000)
            s.connect(addr)
            s.send_multipart([P.CTL, P.encode(P.Failed(spec.model, msg))])
            s.close()
    ctx.term()
