"""Fast path of the host planner: every row a fresh single-token decode row whose request holds a page-table slot,
all in one graph bucket. Its plan equals `step_plan.plan_step(..., fast=False)`'s; for any other row it returns
None before touching any state, the RNG or the staging buffer (docs/engine.md, Host planning)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from tokenrouter.core.batch import Batch
from tokenrouter.core.request import Request
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import Layout, graph_layout
from tokenrouter.engine.page_table import TablePlan
from tokenrouter.engine.plan_types import PartPlan, PlanContext, StepPlan, logprobs_asked, write_requests


@lru_cache(maxsize=128)
def offsets(layout: Layout) -> dict[str, tuple[int, int]]:
    """`layout.offsets()`, cached (a pure function of the frozen layout)."""
    return layout.offsets()


def plan_decode(batch: Batch, ctx: PlanContext, staging: Callable[[int, int], np.ndarray]) -> StepPlan | None:
    rows = batch.rows
    n = len(rows)
    rule = ctx.rule
    if not rule.enabled or n > rule.max_tokens:
        return None
    bucket = rule.bucket_for(n)  # n single-token rows: rule.split puts all of them in the graph part
    if bucket is None:
        return None
    table = ctx.table
    slot_of, owner, written, first, last = table.slot_index, table.owner, table.written, table.first, table.last
    ps, max_ctx, width = ctx.page_size, ctx.max_context_len, table.width
    want, ledger = batch.step_id - 1, ctx.slot_token_step
    tplan = TablePlan([])
    slots = tplan.slots
    reqs: list[Request] = []
    ids: list[int] = []
    pos: list[int] = []
    smap: list[int] = []
    prev_at: list[int] = []
    prev_src: list[int] = []
    no_sample: list[int] = []
    samp: list[tuple[int, object]] = []
    lpk: list[tuple[int, int]] = []
    for i, row in enumerate(rows):
        req = row.req
        s = row.start
        if row.version != req.version or row.num_tokens != 1 or not 0 < s < max_ctx:
            return None
        pages = req.pages
        q = s // ps
        sl = slot_of.get(id(req))
        if sl is None or owner[sl] is not req or len(pages) <= q or q >= width:
            return None
        done = written[sl]
        if done == 0 or len(pages) < done or pages[0] != first[sl] or pages[done - 1] != last[sl]:
            return None
        if done <= q:  # the row enters a new page (or pages after a failed step)
            try:
                table.plan_pages(tplan, i, sl, req, pages, done, q + 1, reqs, str)
            except BatchError:
                return None
            tplan.written[sl] = q + 1
        if row.from_prev:
            if ledger[sl] != want:
                return None
            ids.append(0)
            prev_at.append(i)
            prev_src.append(sl)
        else:
            tl = req.token_ids
            if s >= len(tl):
                return None
            ids.append(tl[s])
        pos.append(s)
        smap.append(pages[q] * ps + s - q * ps)
        slots.append(sl)
        reqs.append(req)
        if not row.sample:
            no_sample.append(i)
            continue
        sp = req.sampling
        if sp.temperature > 0:
            samp.append((i, sp))
        if sp.logprobs is not None:
            k = logprobs_asked(req)
            if k == -1:
                return None  # the general planner names the row
            lpk.append((i, min(k, ctx.vocab_size)))
    if len(set(slots)) != n or min(ids) < 0 or max(ids) >= ctx.vocab_size:
        return None
    layout = graph_layout(bucket)
    if len(tplan.upd_idx) > layout.num_updates:
        return None
    return _finish(batch, ctx, staging, layout, bucket, tplan, reqs, ids, pos, smap, prev_at, prev_src, no_sample,
                   samp, lpk)  # fmt: skip


def _finish(batch, ctx, staging, layout, bucket, tplan, reqs, ids, pos, smap, prev_at, prev_src, no_sample, samp,
            lpk):  # fmt: skip
    """Write the graph part's fields (padding as `inputs` documents) and build the plan."""
    n = len(ids)
    packed = staging(layout.size, 0)[: layout.size]
    packed[:] = 0
    off = offsets(layout)

    def view(f: str) -> np.ndarray:
        o, k = off[f]
        return packed[o : o + k]

    ids_v, pos_v, seq_v, prev_v, rsl_v = map(view, ("input_ids", "positions", "seq_lens", "prev", "row_slots"))
    ids_v[:n] = ids
    pos_v[:n] = pos
    view("slot_mapping")[:n] = smap
    rsl_v[:n] = tplan.slots
    prev_v[:] = -1
    if prev_at:
        ids_v[prev_at] = 0
        prev_v[prev_at] = prev_src
    seq_v[:] = 1
    np.add(pos_v[:n], 1, out=seq_v[:n])
    view("logits_indices")[:n] = np.arange(n)
    oslot = view("out_slot")
    oslot[:n] = rsl_v[:n]
    view("sample_pos")[:n] = seq_v[:n]
    if no_sample:
        oslot[no_sample] = 0
    write_requests(view, n, samp, lpk, (tplan.upd_idx, tplan.upd_val), ctx)
    out_index = np.arange(n, dtype=np.int64)
    if no_sample:
        out_index[no_sample] = -1
        sampled = [i for i in range(n) if out_index[i] >= 0]
    else:
        sampled = list(range(n))
    graph = PartPlan(layout, packed, list(range(n)), 1, bucket, None)
    sampled_slots = [tplan.slots[i] for i in sampled] if no_sample else list(tplan.slots)
    return StepPlan(graph, None, tplan, out_index, sampled, [], reqs, n, sampled_slots, lpk)
