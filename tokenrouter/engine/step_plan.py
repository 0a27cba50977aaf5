"""Host side of one step: validate a core `Batch`, split it into a graph part and an eager part by the
`GraphRule`, plan the page-table writes, and pack each part's inputs (`inputs.Layout`).

Row handling (one pass over the rows, errors name the row before anything is launched or changed):
- stale rows (`row.version != req.version`: the request hopped, finished or was aborted after scheduling) are
  skipped: no KV written, token -1, destination = the batch's model;
- `from_prev` rows take the token that the immediately preceding step of this engine (batch step_id - 1)
  sampled for the same request; if that step failed or never ran, the row is an error, never an older token;
- token ids outside the vocabulary, pages that do not cover the row, page 0, page ids outside the cache and a
  page held by two requests are errors;
- a request in two rows of one batch is an error.

Host cost: O(rows + fed tokens + new pages), independent of context length (the page tables live on the device).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tokenrouter.core.batch import Batch
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.request import Request
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import Layout, graph_layout, pack
from tokenrouter.engine.page_table import PageTable, TablePlan
from tokenrouter.engine.sampler import seed32


@dataclass(slots=True)
class PartPlan:
    layout: Layout
    packed: np.ndarray  # int32 [layout.size], a view of the staging buffer
    rows: list[int]  # batch row indices of this part, in batch order
    max_q_len: int
    bucket: int | None  # graph bucket, None for the eager part
    extra_upd: tuple[np.ndarray, np.ndarray] | None = None  # graph page writes beyond the graph's capacity


@dataclass(slots=True)
class StepPlan:
    graph: PartPlan | None
    eager: PartPlan | None
    table: TablePlan
    out_index: np.ndarray  # [R] int64: row -> index in the step's output (graph logit row j: j; eager: base + j)
    sampled: list[int]  # rows with a sampled token (live, sample=True), batch order
    skipped: list[int]  # stale rows
    live_reqs: list[Request]
    num_tokens: int  # fed tokens (both parts)


@dataclass(slots=True)
class PlanContext:
    """What the planner needs from the engine (fixed per engine, plus the per-slot from_prev ledger)."""

    page_size: int
    max_context_len: int
    vocab_size: int
    rule: GraphRule  # disabled when the engine has no graphs (or they are switched off)
    table: PageTable
    slot_token_step: np.ndarray  # [slots] int64: batch step_id that last sampled into the slot (-1: none/invalid)
    eager_out_base: int  # output index of the eager part's first logit row
    rng: random.Random  # seeds of sampled rows whose request has none


def plan_step(batch: Batch, ctx: PlanContext, staging: Callable[[int, int], np.ndarray]) -> StepPlan:
    """`staging(graph_size, eager_size)` returns an int32 host buffer of at least their sum."""
    rows = batch.rows
    if not rows:
        raise BatchError("empty batch")
    ps = ctx.page_size
    skipped: list[int] = []
    live: list[int] = []
    reqs: list[Request] = []
    starts: list[int] = []
    ntok: list[int] = []
    npages: list[int] = []
    names: list[str] = []
    seen: dict[int, int] = {}
    for i, row in enumerate(rows):
        req = row.req
        if row.version != req.version:
            skipped.append(i)
            continue
        n, start = row.num_tokens, row.start
        ctx_len = start + n
        if n < 1 or start < 0:
            raise BatchError(f"row {i} (request {req.rid}): feeds {n} tokens from {start}; need >= 1 from >= 0")
        if ctx_len > ctx.max_context_len:
            raise BatchError(f"row {i} (request {req.rid}): reaches position {ctx_len - 1}, beyond max_context_len "
                             f"{ctx.max_context_len}")  # fmt: skip
        need = -(-ctx_len // ps)
        if len(req.pages) < need:
            raise BatchError(f"row {i} (request {req.rid}): {len(req.pages)} KV pages cannot hold {ctx_len} tokens")
        j = seen.setdefault(id(req), i)
        if j != i:
            raise BatchError(f"rows {j} and {i}: request {req.rid} appears twice in one batch")
        if row.from_prev and n != 1:
            raise BatchError(f"row {i} (request {req.rid}): a from_prev row feeds exactly 1 token, not {n}")
        live.append(i)
        reqs.append(req)
        starts.append(start)
        ntok.append(n)
        npages.append(need)
        names.append(f"row {i} (request {req.rid})")
    table_plan = ctx.table.plan(reqs, starts, npages, names)
    slots = table_plan.slots

    # from_prev ledger: the source must be the previous step (step_id - 1) and must have sampled this request.
    prev_slot = [-1] * len(live)
    for k, i in enumerate(live):
        if rows[i].from_prev:
            s = ctx.table.slot_of(reqs[k])
            if s is None or s != slots[k] or int(ctx.slot_token_step[s]) != batch.step_id - 1:
                raise BatchError(f"{names[k]}: from_prev row, but step {batch.step_id - 1} of this engine did not "
                                 "sample this request (failed, skipped or never run)")  # fmt: skip
            prev_slot[k] = s

    rule = ctx.rule
    g_idx, e_idx = rule.split(ntok) if rule.enabled else ([], list(range(len(live))))
    g_tokens = sum(ntok[k] for k in g_idx)
    bucket = rule.bucket_for(g_tokens) if g_idx else None
    g_layout = graph_layout(bucket) if bucket is not None else None
    e_tokens = sum(ntok[k] for k in e_idx)
    e_logits = sum(1 for k in e_idx if rows[live[k]].sample)
    upd_idx = np.asarray(table_plan.upd_idx, np.int64)
    upd_val = np.asarray(table_plan.upd_val, np.int64)
    upd_slot = upd_idx // ctx.table.width
    in_graph = np.zeros(ctx.table.num_slots, bool)
    in_graph[[slots[k] for k in g_idx]] = True
    g_upd = in_graph[upd_slot] if upd_idx.size else np.zeros(0, bool)
    e_layout = None
    if e_idx:
        n_e_upd = int((~g_upd).sum())
        e_layout = Layout(e_tokens, len(e_idx), e_logits, n_e_upd, varlen=True)
    g_size = g_layout.size if g_layout else 0
    buf = staging(g_size, e_layout.size if e_layout else 0)

    out_index = np.full(len(rows), -1, np.int64)
    sampled: list[int] = []
    graph = eager = None
    common = (batch, ctx, live, reqs, starts, ntok, slots, prev_slot, names)
    if g_layout is not None:
        gu = g_upd.nonzero()[0]
        cap = g_layout.num_updates
        fields, qmax = _fields(*common, g_idx, virtual=True)
        fields["upd_idx"], fields["upd_val"] = upd_idx[gu[:cap]], upd_val[gu[:cap]]
        extra = (upd_idx[gu[cap:]], upd_val[gu[cap:]]) if gu.size > cap else None
        graph = PartPlan(g_layout, pack(g_layout, fields, buf[:g_size]), [live[k] for k in g_idx], qmax, bucket, extra)
        for j, k in enumerate(g_idx):
            if rows[live[k]].sample:
                out_index[live[k]] = j
    if e_layout is not None:
        eu = (~g_upd).nonzero()[0]
        fields, qmax = _fields(*common, e_idx, virtual=False)
        fields["upd_idx"], fields["upd_val"] = upd_idx[eu], upd_val[eu]
        eager = PartPlan(e_layout, pack(e_layout, fields, buf[g_size:]), [live[k] for k in e_idx], qmax, None)
        j = 0
        for k in e_idx:
            if rows[live[k]].sample:
                out_index[live[k]] = ctx.eager_out_base + j
                j += 1
    sampled = [i for i in live if rows[i].sample]
    return StepPlan(graph, eager, table_plan, out_index, sampled, skipped, reqs, g_tokens + e_tokens)


def _fields(batch, ctx, live, reqs, starts, ntok, slots, prev_slot, names, part, *, virtual):
    """Field arrays of one part (rows `part`, indices into the live lists) and its longest row."""
    rows = batch.rows
    ps, vocab = ctx.page_size, ctx.vocab_size
    n = np.fromiter((ntok[k] for k in part), np.int64, len(part))
    st = np.fromiter((starts[k] for k in part), np.int64, len(part))
    t = int(n.sum())
    cu = np.zeros(len(part) + 1, np.int64)
    np.cumsum(n, out=cu[1:])
    ids = np.empty(t, np.int64)
    slot_map = np.empty(t, np.int64)
    prev = np.full(t, -1, np.int64)
    for j, k in enumerate(part):
        req, s, m, o = reqs[k], starts[k], ntok[k], int(cu[j])
        pages = req.pages
        if m == 1:
            slot_map[o] = pages[s // ps] * ps + s % ps
            if prev_slot[k] >= 0:
                ids[o] = 0
                prev[o] = prev_slot[k]
                continue
            tok = req.token_ids[s : s + 1]
        else:
            pos = np.arange(s, s + m)
            first = s // ps
            pg = np.asarray(pages[first : (s + m - 1) // ps + 1], np.int64)
            slot_map[o : o + m] = pg[pos // ps - first] * ps + pos % ps
            tok = req.token_ids[s : s + m]
        if len(tok) != m:
            raise BatchError(f"{names[k]}: feeds {m} tokens but only {len(tok)} are known")
        ids[o : o + m] = tok
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        at = int(np.argmax(bad))
        k = part[int(np.searchsorted(cu, at, side="right")) - 1]
        raise BatchError(f"{names[k]}: token id {int(ids[at])} outside the vocabulary (0..{vocab - 1})")
    tok_row = np.repeat(np.arange(len(part)), n)
    pos = np.arange(t) - cu[:-1][tok_row] + st[tok_row]
    row_slot = np.fromiter((slots[k] for k in part), np.int64, len(part))
    sample_rows = [j for j, k in enumerate(part) if rows[live[k]].sample]
    if virtual:  # graph: one logit row per batch row (sampled or not), one attention row per token
        logit_rows = list(range(len(part)))
        f = {"seq_lens": pos + 1, "row_slots": row_slot[tok_row]}
    else:
        logit_rows = sample_rows
        f = {"seq_lens": st + n, "row_slots": row_slot, "cu_seqlens_q": cu}
    f.update(input_ids=ids, positions=pos, slot_mapping=slot_map, prev=prev)
    f.update(_sampling(batch, ctx, live, part, logit_rows, row_slot, cu, st + n))
    return f, int(n.max())


def _sampling(batch, ctx, live, part, logit_rows, row_slot, cu, sample_pos) -> dict[str, np.ndarray]:
    rows = batch.rows
    vocab = ctx.vocab_size
    nl = len(logit_rows)
    inv_temp = np.zeros(nl, np.float32)
    top_p = np.ones(nl, np.float32)
    top_k = np.zeros(nl, np.int64)
    seed = np.zeros(nl, np.int64)
    out_slot = np.zeros(nl, np.int64)
    for j, r in enumerate(logit_rows):
        row = rows[live[part[r]]]
        if not row.sample:
            continue
        out_slot[j] = row_slot[r]
        p = row.req.sampling
        if p.temperature > 0:
            inv_temp[j] = np.float32(1.0) / np.float32(p.temperature)
            top_p[j] = p.top_p
            top_k[j] = p.top_k if 0 < p.top_k < vocab else 0
            s = seed32(p.seed) if p.seed is not None else ctx.rng.getrandbits(32)
            seed[j] = s - (1 << 32) if s >= 1 << 31 else s  # stored as int32 bits
    idx = np.asarray(logit_rows, np.int64)
    return {
        "logits_indices": cu[1:][idx] - 1,
        "out_slot": out_slot,
        "inv_temp": inv_temp,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "sample_pos": sample_pos[idx],
    }
