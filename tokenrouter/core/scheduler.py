"""Per-subserver scheduler: a state machine driven from outside, shared by the simulator and the runtime.

Driver contract, KV pages and overlap: docs/core.md. The driver delivers the returned actions (`Send`, `Emit`,
`Finish`) and asks `schedule` again after every delivered message and every completed step (the deadlock-freedom
argument rests on it). The scheduler never sleeps, reads a clock or does I/O; no request is dropped for lack of pages.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from tokenrouter.core.admission import Admission
from tokenrouter.core.batch import Batch, BatchRow, StepResult, TokenLogprobs
from tokenrouter.core.batch_former import BatchFormer
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.kv import KVPool
from tokenrouter.core.live_count import LiveView
from tokenrouter.core.messages import Action, Emit, Finish, LiveCount, PeerMsg, PeerReq, Send
from tokenrouter.core.policy import Policy, SyncGate
from tokenrouter.core.request import ReqStatus, Request
from tokenrouter.core.router import Router

# Finished request ids each subserver remembers (a late message for an older one would fail loudly again).
_GONE_CAPACITY = 1 << 16


class RequestTooLong(ValueError):
    """Prompt plus max_tokens exceeds the context length, or a KV pool of the deployment even alone."""


class Scheduler:
    def __init__(self, model: int, num_models: int, *, kv: KVPool, router: Router, policy: Policy | None = None,
                 entry: int = 0, max_batch_size: int = 256, max_batch_tokens: int = 16384, gate: SyncGate | None = None,
                 overlap: bool = False, graph_rule: GraphRule | None = None, admission: Admission | None = None,
                 max_context_len: int | None = None) -> None:  # fmt: skip
        if not 0 <= model < num_models:
            raise ValueError(f"model index {model} out of range for {num_models} models")
        self.model = model
        self.num_models = num_models
        self.kv = kv
        self.router = router.bind(model, num_models)
        self.policy = policy or Policy()
        if self.policy.is_sync and gate is None:
            raise ValueError(f"policy {self.policy.kind.value!r} needs a SyncGate shared by all subservers")
        self.gate = gate
        if gate is not None:
            gate.attach(model, self.num_ready)
        self.entry = entry
        if admission is not None and model != entry:
            raise ValueError("only the entry subserver admits requests")
        self.admission = admission
        # Longest prompt + max_tokens any model can run (None: only the KV pools bound it). Checked at admission,
        # so an executor never gets a row past its context (the engine would refuse the whole batch).
        self.max_context_len = max_context_len
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.overlap = overlap
        self.graph_rule = graph_rule or GraphRule(enabled=False)
        self.former = BatchFormer(model, kv, self.graph_rule, max_batch_size, max_batch_tokens)
        self.live = LiveView(model, num_models, owner=model == entry)
        self.reqs: dict[str, Request] = {}
        # Requests that ended here (or before they arrived): a message still on its way for one (a return
        # crossing an abort, a hand-off overtaken by the finish) is dropped instead of re-running it.
        self._gone: OrderedDict[str, None] = OrderedDict()
        self.waiting: deque[Request] = deque()
        self.admit_queue: dict[str, Request] = {}  # entry only: arrived, waiting for a KV reservation
        self.inflight: deque[Batch] = deque()
        self.step_id = 0
        self._next_seq = 0

    # ---- state --------------------------------------------------------------------------------------
    @property
    def is_entry(self) -> bool:
        return self.model == self.entry

    @property
    def active(self) -> int:
        """Live requests system-wide, as far as this subserver knows (see `live_count`)."""
        return self.live.active

    @property
    def epoch(self) -> int:
        return self.live.epoch

    def set_policy(self, policy: Policy) -> None:
        """Replace the batching policy between steps; requests, KV and batches in flight are untouched. Sync and
        async policies do not swap (a sync one needs the gate built with the deployment): ValueError."""
        if policy.is_sync != self.policy.is_sync:
            raise ValueError(
                f"cannot switch from {self.policy.kind.value} to {policy.kind.value} while serving: synchronous "
                "policies share a gate built with the deployment (restart instead)"
            )
        self.policy = policy

    @property
    def prepares_ahead(self) -> bool:
        """Whether `schedule` may form step k+1 while step k is in flight: the one overlap rule every driver reads.
        Never with a sync gate: a step formed ahead would skip the routing decision the round synchronizes."""
        return self.overlap and self.gate is None

    @property
    def num_preemptions(self) -> int:
        return self.former.num_preemptions

    def num_ready(self) -> int:
        return len(self.waiting) + len(self._continuations())

    def thresholds(self) -> tuple[int, ...]:
        return self.policy.thresholds_for(self.active, self.num_models)

    def next_deadline(self) -> float | None:
        """When a delayed subserver under its threshold should be asked again (max_wait), else None."""
        if self.policy.max_wait is None or not self.waiting:
            return None
        return min(r.ready_since for r in self.waiting) + self.policy.max_wait

    # ---- inputs -------------------------------------------------------------------------------------
    def add(self, req: Request, now: float = 0.0) -> list[Action]:
        """A client request arrives (entry only): live now, or queued at admission until every pool can hold it.
        Returns the live-count announcements; RequestTooLong if it can never fit."""
        if not self.is_entry:
            raise ValueError(f"requests enter at model {self.entry}, not {self.model}")
        if req.rid in self.reqs or req.rid in self.admit_queue:
            raise ValueError(f"duplicate request id {req.rid!r}")
        self._check_fits(req)
        req.seq, self._next_seq = self._next_seq, self._next_seq + 1
        req.ready_since = now
        self.admit_queue[req.rid] = req
        epoch = self.epoch
        self._admit_queued(now)
        return [Send(m.dst, m) for m in self.live.announce()] if self.epoch != epoch else []

    def resume(self, msg: PeerMsg, now: float = 0.0) -> list[Action]:
        """A peer's message: a live-count update, a handed-over request (new here or returning) or a finish."""
        if isinstance(msg, LiveCount):
            self.live.observe(msg.active, msg.epoch)
            return []
        if self.gate is not None and not msg.finished:
            self.gate.note_arrived(self.model)
        if msg.epoch >= 0:
            self.live.observe(msg.active, msg.epoch)
        if msg.finished:
            return self._peer_finished(msg, now)
        req = self.reqs.get(msg.rid)
        if req is None:
            if msg.rid in self._gone:
                return []  # the request ended while this message was on its way
            if msg.loc != 0 or msg.sampling is None:
                raise ValueError(f"{msg.rid}: first message at model {self.model} must carry the whole sequence")
            req = Request(rid=msg.rid, token_ids=list(msg.tokens), prompt_len=msg.prompt_len, sampling=msg.sampling,
                          num_models=self.num_models, entry=self.entry, eos_token_ids=msg.eos_token_ids,
                          seen=list(msg.seen), num_hops=msg.num_hops, seq=msg.seq)  # fmt: skip
            try:
                self._check_fits(req)
            except RequestTooLong:
                return [Finish(req.rid, "error", req.num_output), *self._broadcast_finish(req.rid, "error")]
            self.reqs[req.rid] = req
            self.router.receive(msg, req)  # a no-op for the tokens; the router sees the first message's extras
        else:
            self.router.receive(msg, req)
            if self.admission is not None:
                self.admission.observe(req)
        req.seen[self.model] = len(req.token_ids)
        self._requeue(req, now)
        return []

    def abort(self, rid: str, now: float = 0.0) -> list[Action]:
        """Cancel a request here (client gone): free its KV and tell every peer to do the same."""
        queued = self.admit_queue.pop(rid, None)
        if queued is not None:  # never went live: no peer knows it
            return [Finish(rid, "abort", 0)]
        req = self.reqs.get(rid)
        if req is None:
            return []
        if req in self.waiting:
            self.waiting.remove(req)
        return self._finish(req, "abort", now)

    def on_peer_restart(self, peer: int, now: float = 0.0) -> list[Action]:
        """Subserver `peer` died and comes back empty: every request here ends with "error" (it may depend on the
        dead peer). No peer is told (each survivor gets the same call); a restarted entry's count is forgotten."""
        actions: list[Action] = []
        for rid in list(self.admit_queue):
            del self.admit_queue[rid]
            actions.append(Finish(rid, "error", 0))
        for req in list(self.reqs.values()):
            self._drop(req, "error")
            if self.admission is not None:
                self.admission.release(req.rid)
            actions.append(Finish(req.rid, "error", req.num_output, req.num_hops))
        self.waiting.clear()
        if self.is_entry:
            if self.live.active:
                self.live.change(-self.live.active)
                actions.extend(Send(m.dst, m) for m in self.live.announce())
        elif peer == self.entry:
            self.live = LiveView(self.model, self.num_models, owner=False)
        return actions

    # ---- scheduling ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        """Form the next batch, or None when the policy says wait or nothing can run."""
        if self.inflight and (not self.prepares_ahead or len(self.inflight) > 1):
            return None
        conts = self._continuations()
        n_ready = len(self.waiting) + len(conts)
        if n_ready == 0:
            return None
        if n_ready < self.thresholds()[self.model]:
            deadline = self.next_deadline()
            if deadline is None or now < deadline:
                return None
        if self.gate is not None and not self.gate.may_launch(self.model):
            return None
        batch = self.former.form(self.step_id, conts, self.waiting, self.reqs.values())
        if batch is None:
            return None
        self.waiting = deque(r for r in self.waiting if r.status == ReqStatus.WAITING)
        self.step_id += 1
        self.inflight.append(batch)
        if self.gate is not None:
            self.gate.on_launch(self.model)
        return batch

    def complete(self, batch: Batch, result: StepResult, now: float = 0.0) -> list[Action]:
        """Apply a finished step: commit or hand off each row's token, finish what is done."""
        if not self.inflight or self.inflight[0] is not batch:
            raise ValueError("complete() must be called for the oldest in-flight batch, in launch order")
        self.inflight.popleft()
        if self.gate is not None:
            self.gate.on_complete(self.model)
        toks: Sequence[int] = _to_list(self.router.select_tokens(batch, result))
        if len(toks) != len(batch.rows):
            raise ValueError(f"step returned {len(toks)} tokens for {len(batch.rows)} rows")
        dests = _to_list(self.router.route(batch, result))
        lps = _committed_logprobs(result, toks)
        actions: list[Action] = []
        model, keep_token, admission = self.model, self.router.keep_token, self.admission
        running, finished = ReqStatus.RUNNING, ReqStatus.FINISHED
        for i, (row, tok, dst) in enumerate(zip(batch.rows, toks, dests, strict=True)):
            req = row.req
            if row.version != req.version or req.status != running:
                continue  # stale: the request left after this batch was prepared
            req.num_computed = row.start + row.num_tokens
            req.num_inflight -= 1
            last = req.num_inflight == 0  # no later row of it is in flight: it is ours to requeue
            if not row.sample:
                if last:
                    self._requeue(req, now, front=True)
                continue
            tok, dst = int(tok), int(dst)
            req.token_ids.append(tok)
            if dst != model and not keep_token(req, dst):
                req.token_ids.pop()
                self._hand_off(req, dst, actions)
                continue
            lp = [lps[i]] if lps is not None and req.sampling.logprobs is not None else None
            actions.append(Emit(req.rid, [tok], len(req.token_ids) - req.prompt_len - 1, model, lp))
            reason = req.stop_reason()
            if reason is not None:
                actions.extend(self._finish(req, reason, now))
            elif dst != model:
                self._hand_off(req, dst, actions)
            elif last:
                self._requeue(req, now)
            if admission is not None and req.status != finished:
                admission.observe(req)
        return actions

    # ---- batch formation ----------------------------------------------------------------------------
    def _continuations(self) -> list[BatchRow]:
        """Rows of the batch in flight that continue into the next one (overlap), newest batch only."""
        if not self.prepares_ahead or not self.inflight:
            return []
        out = []
        may_stay = self.router.may_stay
        for row in self.inflight[-1].rows:
            req = row.req
            if not row.sample or row.version != req.version or req.status != ReqStatus.RUNNING:
                continue
            # Leave out rows that would only be wasted: the request's last token, or a request that surely leaves.
            if req.num_inflight == 1 and req.num_output + 1 < req.sampling.max_tokens and may_stay(req):
                out.append(row)
        return out

    # ---- lifecycle ----------------------------------------------------------------------------------
    def _requeue(self, req: Request, now: float, front: bool = False) -> None:
        req.status = ReqStatus.WAITING
        req.ready_since = now
        (self.waiting.appendleft if front else self.waiting.append)(req)

    def _hand_off(self, req: Request, dst: int, actions: list[Action]) -> None:
        req.seen[self.model] = len(req.token_ids)
        if dst != self.entry:  # a hop is a visit away from the entry model; the way back is not another
            req.num_hops += 1
        req.version += 1
        req.status = ReqStatus.PENDING
        req.num_inflight = 0
        msg = self.router.send(req, dst)
        msg.seq, msg.active, msg.epoch = req.seq, self.active, self.epoch
        req.seen[dst] = len(req.token_ids)
        actions.append(Send(dst, msg))
        if self.gate is not None:
            self.gate.note_sent(dst)

    def _finish(self, req: Request, reason: str, now: float) -> list[Action]:
        self._drop(req, reason)
        actions: list[Action] = [Finish(req.rid, reason, req.num_output, req.num_hops)]
        if self.is_entry:
            self._count_finish(req.rid, now)
        actions.extend(self._broadcast_finish(req.rid, reason))
        return actions

    def _peer_finished(self, msg: PeerReq, now: float) -> list[Action]:
        req = self.reqs.get(msg.rid)
        if req is None:
            self._remember_gone(msg.rid)  # a hand-off may still arrive on another link: it must not run
            return []
        if req in self.waiting:
            self.waiting.remove(req)
        self._drop(req, msg.finish_reason)
        if not self.is_entry:
            return []
        # The finisher told every peer about the request; the entry announces the new count.
        self._count_finish(msg.rid, now)
        return [Send(m.dst, m) for m in self.live.announce()]

    def _drop(self, req: Request, reason: str | None) -> None:
        req.status = ReqStatus.FINISHED
        req.finish_reason = reason
        req.version += 1
        req.num_inflight = 0
        self.kv.release(req.pages)
        self.router.on_finish(req)
        self.reqs.pop(req.rid, None)
        self._remember_gone(req.rid)

    def _remember_gone(self, rid: str) -> None:
        self._gone[rid] = None
        if len(self._gone) > _GONE_CAPACITY:
            self._gone.popitem(last=False)

    def _count_finish(self, rid: str, now: float) -> None:
        """Entry: one live request fewer; its reservation goes back and queued requests may go live."""
        self.live.change(-1)
        if self.admission is not None:
            self.admission.release(rid)
        self._admit_queued(now)

    def _admit_queued(self, now: float) -> None:
        while self.admit_queue:
            req = next(iter(self.admit_queue.values()))
            if self.admission is not None and not self.admission.try_reserve(req):
                return
            del self.admit_queue[req.rid]
            req.seen[self.model] = len(req.token_ids)
            self.reqs[req.rid] = req
            self._requeue(req, now)
            self.live.change(+1)

    def _broadcast_finish(self, rid: str, reason: str) -> list[Action]:
        live = {"active": self.active, "epoch": self.epoch}
        peers = (p for p in range(self.num_models) if p != self.model)
        return [Send(p, PeerReq(rid, self.model, p, finished=True, finish_reason=reason, **live)) for p in peers]

    def _check_fits(self, req: Request) -> None:
        need = req.prompt_len + req.sampling.max_tokens
        if self.max_context_len is not None and need > self.max_context_len:
            raise RequestTooLong(
                f"{req.rid}: prompt {req.prompt_len} + max_tokens {req.sampling.max_tokens} exceeds the context "
                f"length {self.max_context_len}"
            )
        where = self.admission.fits_alone(req) if self.admission is not None else None
        if where is None and need > self.kv.capacity_tokens:
            where = self.model
        if where is not None:
            raise RequestTooLong(
                f"{req.rid}: prompt {req.prompt_len} + max_tokens {req.sampling.max_tokens} exceeds the KV pool "
                f"of model {where}"
            )


def _committed_logprobs(result: StepResult, toks: Sequence[int]) -> list[TokenLogprobs | None] | None:
    """The engine's logprobs per row, for the token each row commits: for a token other than the one sampled (the
    ensemble's choice) its logprob from the row's top k when there, else None."""
    if result.logprobs is None:
        return None
    sampled = _to_list(result.next_token_ids)
    out: list[TokenLogprobs | None] = []
    for lp, tok, s in zip(result.logprobs, toks, sampled, strict=True):
        if lp is None or int(tok) == int(s):
            out.append(lp)
            continue
        hit = next((v for t, v in lp.top if t == int(tok)), None)
        out.append(None if hit is None else TokenLogprobs(hit, lp.top))
    return out


def _to_list(x: Any) -> list[Any]:
    return x.tolist() if hasattr(x, "tolist") else list(x)
