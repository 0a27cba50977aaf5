"""Forming one subserver's next batch: which rows go in (continuations first, then the ready queue), their KV pages,
and the graph/eager split (docs/core.md, "The graph rule"); a row that cannot get pages is skipped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import ReqStatus, Request
from tokenrouter.core.victims import victims


class BatchFormer:
    def __init__(self, model: int, kv: KVPool, rule: GraphRule, max_batch_size: int, max_batch_tokens: int) -> None:
        self.model = model
        self.kv = kv
        self.rule = rule
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.num_preemptions = 0

    def form(
        self, step_id: int, conts: list[BatchRow], waiting: Iterable[Request], reqs: Collection[Request]
    ) -> Batch | None:
        """The next batch, or None if no row can run. Picked requests become RUNNING with one more row in
        flight; the caller takes them off its queue."""
        queue = list(waiting)
        batch, short = self._rows(step_id, conts, queue, reqs)
        if not batch.rows and short is not None and self._grow(*short, set(), reqs, any_age=True):
            batch, _ = self._rows(step_id, conts, queue, reqs)  # older parked requests gave pages back
        if not batch.rows:
            return None
        batch.graph_rows = self.rule.split([r.num_tokens for r in batch.rows])[0]
        for row in batch.rows:
            row.req.num_inflight += 1
            row.req.status = ReqStatus.RUNNING
        return batch

    def _rows(
        self, step_id: int, conts: list[BatchRow], queue: list[Request], reqs: Collection[Request]
    ) -> tuple[Batch, tuple[Request, int] | None]:
        batch = Batch(self.model, step_id)
        rule, budget = self.rule, self.max_batch_tokens
        graph_room, has_eager = rule.max_tokens, False
        picked: set[int] = set()
        short: tuple[Request, int] | None = None  # the first row that could not get pages
        rows = [(p.req, p.start + p.num_tokens) for p in conts] + [(r, -1) for r in queue]
        for req, start in rows:
            if len(batch.rows) >= self.max_batch_size or budget < 1:
                break
            from_prev = start >= 0
            if from_prev:
                n = 1
            else:  # read now: an earlier row of this batch may have preempted it
                start, n = req.num_computed, min(req.num_new, budget)  # n < num_new: a prefill chunk
            in_graph = rule.row_fits(n) and n <= graph_room
            if rule.row_fits(n) and not in_graph and not has_eager and batch.rows:
                continue  # the graph part is full: do not open an eager pass for a row that fits a graph
            if not self._grow(req, start + n, picked, reqs):
                short = short or (req, start + n)
                continue
            if in_graph:
                graph_room -= n
            else:
                has_eager = True
            batch.rows.append(BatchRow(req, start, n, from_prev or n == req.num_new, req.version, from_prev=from_prev))
            picked.add(id(req))
            budget -= n
        return batch, short

    def _grow(
        self, req: Request, num_tokens: int, protected: set[int], reqs: Collection[Request], any_age: bool = False
    ) -> bool:
        """Give `req` pages for `num_tokens`, preempting younger parked or queued requests if the pool is short.
        Nobody is preempted unless that frees enough: a victim's work is never thrown away for nothing."""
        if self.kv.grow(req.pages, num_tokens):
            return True
        need = self.kv.extra_pages(req.pages, num_tokens)
        taken, freed = [], self.kv.num_free
        for victim in victims(reqs, req, protected, any_age=any_age):
            taken.append(victim)
            freed += len(victim.pages)
            if freed >= need:
                break
        if freed < need:
            return False
        for victim in taken:
            self.kv.release(victim.pages)
            victim.num_computed = 0
            victim.num_preemptions += 1
            self.num_preemptions += 1
        return self.kv.grow(req.pages, num_tokens)
