"""Per-subserver scheduler: a state machine driven from outside, shared by the simulator and the runtime.

Driver contract (the simpy process and the runtime loop both follow it):
    sched.add(req, now)                 # a client request arrives at the entry subserver
    acts = sched.resume(peer_req, now)  # a message from a peer arrives
    batch = sched.schedule(now)         # launch? (None: policy says wait, or nothing is ready)
    ...run batch on the executor...
    acts = sched.complete(batch, result, now)
and it delivers the returned actions (`Send`, `Emit`, `Finish`). The scheduler never sleeps, reads a
clock or does I/O. KV pages are allocated in `schedule`, kept while a request is PENDING on a peer,
freed at finish/abort, and taken back from parked or queued requests (which then recompute) when the
pool runs short: a request is never dropped for lack of pages.

Overlap (`overlap=True`): `schedule` may be called while one batch is in flight; sampling rows of that
batch continue into the new batch with `from_prev=True` (the executor feeds the token the previous step
samples, without a host round trip). If `complete` of the earlier batch sends such a request away or
finishes it, its version changes and the prepared row's result is ignored: it is dropped from step k+1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from tokenrouter.core.batch import Batch, BatchRow, StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.core.messages import Action, Emit, Finish, PeerReq, Send
from tokenrouter.core.policy import Policy, SyncGate
from tokenrouter.core.request import ReqStatus, Request
from tokenrouter.core.router import Router


class RequestTooLong(ValueError):
    """A request whose prompt plus max_tokens cannot fit this subserver's KV pool even alone."""


class Scheduler:
    def __init__(
        self,
        model: int,
        num_models: int,
        *,
        kv: KVPool,
        router: Router,
        policy: Policy | None = None,
        entry: int = 0,
        max_batch_size: int = 256,
        max_batch_tokens: int = 16384,
        gate: SyncGate | None = None,
        overlap: bool = False,
    ) -> None:
        if not 0 <= model < num_models:
            raise ValueError(f"model index {model} out of range for {num_models} models")
        self.model = model
        self.num_models = num_models
        self.kv = kv
        self.router = router.bind(model, num_models)
        self.policy = policy or Policy()
        if self.policy.is_sync and gate is None:
            raise ValueError(f"policy {self.policy.kind!r} needs a SyncGate shared by all subservers")
        self.gate = gate
        if gate is not None:
            gate.attach(model, self.num_ready)
        self.entry = entry
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.overlap = overlap
        self.reqs: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.inflight: deque[Batch] = deque()
        self.active = 0  # live requests system-wide, as far as this subserver knows
        self.epoch = 0
        self.step_id = 0
        self.num_preemptions = 0

    # ---- inputs -------------------------------------------------------------------------------------
    @property
    def is_entry(self) -> bool:
        return self.model == self.entry

    def num_ready(self) -> int:
        return len(self.waiting) + sum(1 for r in self._continuations())

    def add(self, req: Request, now: float = 0.0) -> None:
        """Admit a client request (entry subserver only). Raises RequestTooLong if it can never fit."""
        if not self.is_entry:
            raise ValueError(f"requests enter at model {self.entry}, not {self.model}")
        if req.rid in self.reqs:
            raise ValueError(f"duplicate request id {req.rid!r}")
        self._check_fits(req)
        req.status = ReqStatus.WAITING
        req.ready_since = now
        req.seen[self.model] = len(req.token_ids)
        self.reqs[req.rid] = req
        self.waiting.append(req)
        self.active += 1
        self.epoch += 1

    def resume(self, msg: PeerReq, now: float = 0.0) -> list[Action]:
        """Take a message from a peer: a handed-over request (new here or returning) or a finish."""
        if self.gate is not None and not msg.finished:
            self.gate.note_arrived(self.model)
        if not self.is_entry and msg.epoch > self.epoch:
            self.active, self.epoch = msg.active, msg.epoch
        if msg.finished:
            return self._peer_finished(msg)
        req = self.reqs.get(msg.rid)
        if req is None:
            if msg.loc != 0 or msg.sampling is None:
                raise ValueError(f"{msg.rid}: first message at model {self.model} must carry the whole sequence")
            req = Request(
                rid=msg.rid,
                token_ids=list(msg.tokens),
                prompt_len=msg.prompt_len,
                sampling=msg.sampling,
                num_models=self.num_models,
                entry=self.entry,
                eos_token_ids=msg.eos_token_ids,
                seen=list(msg.seen),
                num_hops=msg.num_hops,
            )
            try:
                self._check_fits(req)
            except RequestTooLong:
                return [Finish(req.rid, "error", req.num_output), *self._broadcast_finish(req.rid, "error")]
            self.reqs[req.rid] = req
        else:
            self.router.receive(msg, req)
            if self.policy.kind == "std-serving":
                req.extras["_rematch"] = True
        req.seen[self.model] = len(req.token_ids)
        req.status = ReqStatus.WAITING
        req.ready_since = now
        self.waiting.append(req)
        return []

    def abort(self, rid: str) -> list[Action]:
        """Cancel a request here (client gone): free its KV and tell every peer to do the same."""
        req = self.reqs.get(rid)
        if req is None:
            return []
        if req in self.waiting:
            self.waiting.remove(req)
        return self._finish(req, "abort")

    # ---- scheduling ---------------------------------------------------------------------------------
    def thresholds(self) -> tuple[int, ...]:
        return self.policy.thresholds_for(self.active, self.num_models)

    def next_deadline(self) -> float | None:
        """When a delayed subserver under its threshold should be asked again (max_wait), else None."""
        if self.policy.max_wait is None or not self.waiting:
            return None
        return min(r.ready_since for r in self.waiting) + self.policy.max_wait

    def schedule(self, now: float) -> Batch | None:
        """Form the next batch, or None when the policy says wait or nothing can run."""
        if self.inflight and not self.overlap:
            return None
        if len(self.inflight) > 1:
            return None
        conts = list(self._continuations())
        n_ready = len(self.waiting) + len(conts)
        if n_ready == 0:
            return None
        if n_ready < self.thresholds()[self.model]:
            deadline = self.next_deadline()
            if deadline is None or now < deadline:
                return None
        if self.gate is not None and not self.gate.may_launch(self.model):
            return None
        batch = Batch(self.model, self.step_id)
        budget = self.max_batch_tokens
        for prev in conts:
            if len(batch.rows) >= self.max_batch_size or budget < 1:
                break
            start = prev.start + prev.num_tokens
            if not self._grow(prev.req, start + 1, batch):
                break
            prev.req.extras["_inflight"] = prev.req.extras.get("_inflight", 1) + 1
            batch.rows.append(BatchRow(prev.req, start, 1, True, prev.req.version, from_prev=True))
            budget -= 1
        picked: list[Request] = []
        for req in self.waiting:
            if len(batch.rows) >= self.max_batch_size or budget < 1:
                break
            n = min(req.num_new, budget)  # n < num_new: a prefill chunk that samples nothing yet
            if not self._grow(req, req.num_computed + n, batch, picked):
                break
            row = BatchRow(req, req.num_computed, n, n == req.num_new, req.version)
            row.rematch = bool(req.extras.pop("_rematch", False))
            batch.rows.append(row)
            picked.append(req)
            budget -= n
        if not batch.rows:
            return None
        for req in picked:  # picked is a prefix of the queue: the loop stops at the first row that fails
            self.waiting.popleft()
            req.status = ReqStatus.RUNNING
            req.extras["_inflight"] = 1
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
        toks: Sequence[int] = _to_list(result.next_token_ids)
        if len(toks) != len(batch.rows):
            raise ValueError(f"step returned {len(toks)} tokens for {len(batch.rows)} rows")
        dests = _to_list(self.router.route(batch, result))
        actions: list[Action] = []
        for row, tok, dst in zip(batch.rows, toks, dests, strict=True):
            req = row.req
            if row.version != req.version or req.status != ReqStatus.RUNNING:
                continue  # stale: the request left after this batch was prepared
            req.num_computed = row.start + row.num_tokens
            still_inflight = req.extras.get("_inflight", 1) > 1
            req.extras["_inflight"] = req.extras.get("_inflight", 1) - 1
            if not row.sample:
                if not still_inflight:
                    self._requeue(req, now, front=True)
                continue
            req.token_ids.append(int(tok))
            dst = int(dst)
            if dst != self.model and not self.router.keep_token(req, dst):
                req.token_ids.pop()
                self._hand_off(req, dst, actions)
                continue
            actions.append(Emit(req.rid, [int(tok)], req.num_output - 1, self.model))
            reason = req.stop_reason()
            if reason is not None:
                actions.extend(self._finish(req, reason))
            elif dst != self.model:
                self._hand_off(req, dst, actions)
            elif not still_inflight:
                self._requeue(req, now)
        return actions

    # ---- internals ----------------------------------------------------------------------------------
    def _continuations(self):
        if not self.overlap or not self.inflight:
            return
        for row in self.inflight[-1].rows:
            req = row.req
            live = row.sample and row.version == req.version and req.status == ReqStatus.RUNNING
            if live and req.extras.get("_inflight", 1) == 1:
                yield row

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
        req.extras["_inflight"] = 0
        msg = self.router.send(req, dst)
        msg.active, msg.epoch = self.active, self.epoch
        req.seen[dst] = len(req.token_ids)
        actions.append(Send(dst, msg))
        if self.gate is not None:
            self.gate.note_sent(dst)

    def _finish(self, req: Request, reason: str) -> list[Action]:
        req.status = ReqStatus.FINISHED
        req.finish_reason = reason
        req.version += 1
        self.kv.release(req.pages)
        self.router.on_finish(req)
        self.reqs.pop(req.rid, None)
        actions: list[Action] = [Finish(req.rid, reason, req.num_output, req.num_hops)]
        if self.is_entry:
            self.active -= 1
            self.epoch += 1
        actions.extend(self._broadcast_finish(req.rid, reason))
        return actions

    def _broadcast_finish(self, rid: str, reason: str) -> list[Action]:
        peers = (p for p in range(self.num_models) if p != self.model)
        return [
            Send(
                p,
                PeerReq(rid, self.model, p, finished=True, finish_reason=reason, active=self.active, epoch=self.epoch),
            )
            for p in peers
        ]

    def _peer_finished(self, msg: PeerReq) -> list[Action]:
        req = self.reqs.pop(msg.rid, None)
        if req is None:
            return []
        if req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED
        req.finish_reason = msg.finish_reason
        req.version += 1
        self.kv.release(req.pages)
        self.router.on_finish(req)
        if not self.is_entry:
            return []
        # The entry owns the live count: tell every peer (the finisher too) the new value.
        self.active -= 1
        self.epoch += 1
        return self._broadcast_finish(msg.rid, msg.finish_reason or "stop")

    def _check_fits(self, req: Request) -> None:
        need = req.prompt_len + req.sampling.max_tokens
        if need > self.kv.capacity_tokens:
            raise RequestTooLong(
                f"{req.rid}: prompt {req.prompt_len} + max_tokens {req.sampling.max_tokens} exceeds the KV pool "
                f"of model {self.model} ({self.kv.capacity_tokens} tokens)"
            )

    def _grow(self, req: Request, num_tokens: int, batch: Batch, picked: Sequence[Request] = ()) -> bool:
        """Give `req` pages for `num_tokens`, preempting parked or queued requests if the pool is short."""
        if self.kv.grow(req.pages, num_tokens):
            return True
        need = self.kv.extra_pages(req.pages, num_tokens)
        in_batch = {id(r.req) for r in batch.rows} | {id(r) for r in picked} | {id(req)}
        for victim in self._victims(in_batch):
            self._preempt(victim)
            if self.kv.num_free >= need:
                return self.kv.grow(req.pages, num_tokens)
        return False

    def _victims(self, protected: set[int]):
        """Parked requests first (their owner is elsewhere), newest first; then queued ones from the back."""
        parked = [r for r in self.reqs.values() if r.status == ReqStatus.PENDING and r.pages]
        yield from reversed(parked)
        for r in reversed(self.waiting):
            if id(r) not in protected and r.pages:
                yield r

    def _preempt(self, req: Request) -> None:
        self.kv.release(req.pages)
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1


def _to_list(x: Any) -> list[Any]:
    return x.tolist() if hasattr(x, "tolist") else list(x)
