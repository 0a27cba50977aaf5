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
One pass over the rows validates them; one pass per part writes each field straight into the staging buffer:
rows of up to `_SMALL` tokens (decode rows, peer returns) go through Python lists (one numpy conversion per
field), longer rows (prefill chunks) through numpy slices; greedy rows touch no sampling field (the zeroed
buffer already says greedy). No per-step array is sized by the cache or the slot count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.decode_plan import offsets, plan_decode
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import Layout, graph_layout
from tokenrouter.engine.plan_types import (
    PartPlan,
    PlanContext,
    StepPlan,
    logprobs_asked,
    write_logprobs,
    write_sampling,
)
from tokenrouter.engine.sampler import MAX_LOGPROBS

__all__ = ["PartPlan", "PlanContext", "StepPlan", "plan_step"]

_SMALL = 16  # rows up to this many tokens are packed through Python lists, longer ones through numpy


def plan_step(batch: Batch, ctx: PlanContext, staging: Callable[[int, int], np.ndarray], *,
              fast: bool = True) -> StepPlan:  # fmt: skip
    """`staging(graph_size, eager_size)` returns an int32 host buffer of at least their sum (called once).
    `fast`: try `decode_plan.plan_decode` first (same plan, see there); False is the reference for tests."""
    rows = batch.rows
    if not rows:
        raise BatchError("empty batch")
    if fast:
        plan = plan_decode(batch, ctx, staging)
        if plan is not None:
            return plan
    checked = _check_rows(rows, ctx)
    live, reqs, starts, ntok = checked.live, checked.reqs, checked.starts, checked.ntok
    total, longest = checked.total, checked.longest

    def name(k: int) -> str:  # built only for an error message
        return f"row {live[k]} (request {reqs[k].rid})"

    table = ctx.table
    table_plan = table.plan(reqs, starts, checked.npages, name)
    slots = table_plan.slots

    # from_prev ledger: the source must be the previous step (step_id - 1) and must have sampled this request
    # into the slot the request holds now (the plan never moves a request that holds a slot).
    prev_slot: dict[int, int] = {}
    want, ledger, owner = batch.step_id - 1, ctx.slot_token_step, table.owner
    for k in checked.from_prev:
        s = slots[k]
        if owner[s] is not reqs[k] or ledger[s] != want:
            raise BatchError(f"{name(k)}: from_prev row, but step {want} of this engine did not sample this "
                             "request (failed, skipped or never run)", (reqs[k].rid,))  # fmt: skip
        prev_slot[k] = s

    rule = ctx.rule
    everything = list(range(len(live)))
    if not rule.enabled:
        g_idx, e_idx = [], everything
    elif longest <= rule.max_row_tokens and total <= rule.max_tokens:
        g_idx, e_idx = everything, []  # every row fits and the room never runs out: what rule.split returns
    else:
        g_idx, e_idx = rule.split(ntok)
    bucket = rule.bucket_for(sum(ntok[k] for k in g_idx)) if g_idx else None

    # Page-table writes go with the part whose rows own the slot.
    g_upd: tuple[list[int], list[int]] = ([], [])
    e_upd: tuple[list[int], list[int]] = ([], [])
    if table_plan.upd_idx:
        if not e_idx:
            g_upd = (table_plan.upd_idx, table_plan.upd_val)
        elif not g_idx:
            e_upd = (table_plan.upd_idx, table_plan.upd_val)
        else:
            gs, w = {slots[k] for k in g_idx}, table.width
            for f, v in zip(table_plan.upd_idx, table_plan.upd_val, strict=True):
                dst = g_upd if f // w in gs else e_upd
                dst[0].append(f)
                dst[1].append(v)

    g_layout = graph_layout(bucket) if bucket is not None else None
    e_layout = shape = None
    e_part: list[int] = e_idx  # attention-row order of the varlen part (-1: padding row)
    if e_idx:
        fit = ctx.varlen.fit([ntok[k] for k in e_idx]) if ctx.varlen is not None else None
        if fit is not None:
            shape, order = fit
            e_layout = shape.layout
            e_part = [e_idx[o] if o >= 0 else -1 for o in order]
        else:
            e_logits = sum(1 for k in e_idx if rows[live[k]].sample)
            e_layout = Layout(sum(ntok[k] for k in e_idx), len(e_idx), e_logits, len(e_upd[0]), varlen=True)
    g_size = g_layout.size if g_layout else 0
    buf = staging(g_size, e_layout.size if e_layout else 0)

    out_index = [-1] * len(rows)
    known = _PlanRows(rows, ctx, checked, slots, prev_slot, name)
    graph = eager = None
    if g_layout is not None:
        g_upd, extra = _cap_updates(g_upd, g_layout.num_updates)
        packed = buf[:g_size]
        qmax = _write_part(known, _Part(g_idx, g_layout, packed, g_upd, virtual=True))
        graph = PartPlan(g_layout, packed, [live[k] for k in g_idx], qmax, bucket, extra)
        for j, k in enumerate(g_idx):
            if rows[live[k]].sample:
                out_index[live[k]] = j
    if e_layout is not None:
        packed = buf[g_size : g_size + e_layout.size]
        extra = None
        if shape is not None:
            e_upd, extra = _cap_updates(e_upd, e_layout.num_updates)
        qmax = _write_part(known, _Part(e_part, e_layout, packed, e_upd, virtual=False))
        real = [k for k in e_part if k >= 0]
        eager = PartPlan(e_layout, packed, [live[k] for k in real], qmax, shape.tokens if shape else None, extra,
                         shape)  # fmt: skip
        j = ctx.eager_out_base
        for k in real:
            if rows[live[k]].sample:
                out_index[live[k]] = j
                j += 1
    sampled = [k for k in everything if rows[live[k]].sample]
    vocab = ctx.vocab_size
    asked = [(live[k], min(n, vocab)) for k in sampled if (n := logprobs_asked(reqs[k])) is not None]
    return StepPlan(graph, eager, table_plan, np.asarray(out_index, np.int64), [live[k] for k in sampled],
                    checked.skipped, reqs, total, [slots[k] for k in sampled], asked)  # fmt: skip


def _cap_updates(upd: tuple[list[int], list[int]], cap: int):
    """Page writes a graph replay carries (the first `cap`) and the rest, scattered before the replay."""
    if len(upd[0]) <= cap:
        return upd, None
    extra = (np.asarray(upd[0][cap:], np.int64), np.asarray(upd[1][cap:], np.int64))
    return (upd[0][:cap], upd[1][:cap]), extra


@dataclass(frozen=True, slots=True)
class _Checked:
    """The batch's live rows after validation, as parallel lists indexed by live position k (the planner's
    row index from here on)."""

    live: list[int]  # batch row index of each live row
    reqs: list[Request]
    starts: list[int]  # first fed position
    ntok: list[int]  # fed tokens
    npages: list[int]  # pages the row's context needs
    from_prev: list[int]  # live indices of from_prev rows
    skipped: list[int]  # batch row indices of stale rows
    total: int  # fed tokens, all live rows
    longest: int  # the longest row's tokens


@dataclass(frozen=True, slots=True)
class _PlanRows:
    """What every part's writer reads: the batch, the checked rows, their page-table slots and from_prev sources."""

    rows: list[BatchRow]
    ctx: PlanContext
    checked: _Checked
    slots: list[int]  # page-table slot of each live row
    prev_slot: dict[int, int]  # live index of a from_prev row -> the slot holding its token
    name: Callable[[int], str]  # a live row's name for error messages


@dataclass(frozen=True, slots=True)
class _Part:
    """One pass's share of the step: which live rows, packed how, where."""

    part: list[int]  # live indices in attention-row order (-1: a varlen graph's padding row)
    layout: Layout
    packed: np.ndarray  # int32 [layout.size], a view of the staging buffer
    upd: tuple[list[int], list[int]]  # page-table writes this pass carries (flat index, page)
    virtual: bool  # graph layout: one virtual decode attention row per token


def _check_rows(rows: list[BatchRow], ctx: PlanContext) -> _Checked:
    """Validate row by row: skip stale rows, raise BatchError naming the first bad row."""
    ps, max_ctx = ctx.page_size, ctx.max_context_len
    skipped: list[int] = []
    live: list[int] = []
    reqs: list[Request] = []
    starts: list[int] = []
    ntok: list[int] = []
    npages: list[int] = []
    from_prev: list[int] = []  # live indices of from_prev rows
    seen: dict[int, int] = {}
    total = longest = 0
    for i, row in enumerate(rows):
        req = row.req
        if row.version != req.version:
            skipped.append(i)
            continue
        n, start = row.num_tokens, row.start
        end = start + n
        if n < 1 or start < 0:
            raise BatchError(f"row {i} (request {req.rid}): feeds {n} tokens from {start}; need >= 1 from >= 0",
                             (req.rid,))  # fmt: skip
        if end > max_ctx:
            raise BatchError(f"row {i} (request {req.rid}): reaches position {end - 1}, beyond max_context_len "
                             f"{max_ctx}", (req.rid,))  # fmt: skip
        need = (end + ps - 1) // ps
        if len(req.pages) < need:
            raise BatchError(f"row {i} (request {req.rid}): {len(req.pages)} KV pages cannot hold {end} tokens",
                             (req.rid,))  # fmt: skip
        j = seen.setdefault(id(req), i)
        if j != i:
            raise BatchError(f"rows {j} and {i}: request {req.rid} appears twice in one batch", (req.rid,))
        if row.sample and logprobs_asked(req) == -1:
            raise BatchError(f"row {i} (request {req.rid}): logprobs {req.sampling.logprobs} outside "
                             f"0..{MAX_LOGPROBS}", (req.rid,))  # fmt: skip
        if row.from_prev:
            if n != 1:
                raise BatchError(f"row {i} (request {req.rid}): a from_prev row feeds exactly 1 token, not {n}",
                                 (req.rid,))  # fmt: skip
            from_prev.append(len(live))
        live.append(i)
        reqs.append(req)
        starts.append(start)
        ntok.append(n)
        npages.append(need)
        total += n
        longest = n if n > longest else longest
    return _Checked(live, reqs, starts, ntok, npages, from_prev, skipped, total, longest)


def _write_part(known: _PlanRows, p: _Part) -> int:
    """Write the fields of one part (rows `p.part`, indices into the live lists) into `p.packed`, padded as
    `inputs` documents; returns the part's longest row. Graph (`virtual`): one attention row per token and one
    logit row per batch row; eager: one attention row per batch row and logit rows for sampled rows only."""
    rows, ctx, slots, prev_slot, name = known.rows, known.ctx, known.slots, known.prev_slot, known.name
    c = known.checked
    live, reqs, starts, ntok = c.live, c.reqs, c.starts, c.ntok
    part, layout, packed, upd, virtual = p.part, p.layout, p.packed, p.upd, p.virtual
    ps = ctx.page_size
    off = offsets(layout)

    def view(f: str) -> np.ndarray:
        o, n = off[f]
        return packed[o : o + n]

    packed[:] = 0
    ids_v, pos_v, smap_v, prev_v, seq_v, rsl_v = map(view, ("input_ids", "positions", "slot_mapping", "prev",
                                                             "seq_lens", "row_slots"))  # fmt: skip
    prev_v[:] = -1
    seq_v[:] = 1
    ids: list[int] = []
    pos: list[int] = []
    smap: list[int] = []
    rsl: list[int] = []  # graph: per token; eager: per row
    seqs: list[int] = []  # eager: per row
    cu = [0]
    li: list[int] = []  # logit rows: last token, out slot, sample position
    oslot: list[int] = []
    spos: list[int] = []
    samp: list[tuple[int, object]] = []  # (logit row, SamplingParams) of rows with temperature > 0
    lpk: list[tuple[int, int]] = []  # (logit row, k) of rows that ask for log-probabilities
    prev_at: list[int] = []
    prev_src: list[int] = []
    t = flushed = qmax = 0

    def flush() -> None:  # pending list entries -> tokens [flushed, t)
        try:
            ids_v[flushed:t] = ids
        except (OverflowError, ValueError, TypeError):
            _bad_token(known, part)
            raise
        pos_v[flushed:t] = pos
        smap_v[flushed:t] = smap
        if virtual:
            rsl_v[flushed:t] = rsl
            rsl.clear()
        ids.clear()
        pos.clear()
        smap.clear()

    for k in part:
        if k < 0:  # a padding attention row of a varlen graph: no queries, the null slot
            cu.append(t)
            seqs.append(1)
            rsl.append(0)
            continue
        req, s, m, sl = reqs[k], starts[k], ntok[k], slots[k]
        pages = req.pages
        if m == 1:  # the common case: one token, one page lookup
            src = prev_slot.get(k) if prev_slot else None
            if src is not None:
                ids.append(0)
                prev_at.append(t)
                prev_src.append(src)
            else:
                tl = req.token_ids
                if s >= len(tl):
                    raise BatchError(f"{name(k)}: feeds 1 tokens but only 0 are known", (req.rid,))
                ids.append(tl[s])
            pos.append(s)
            smap.append(pages[s // ps] * ps + s % ps)
            if virtual:
                rsl.append(sl)
        else:
            tok = req.token_ids[s : s + m]
            if len(tok) != m:
                raise BatchError(f"{name(k)}: feeds {m} tokens but only {len(tok)} are known", (req.rid,))
            if m <= _SMALL:
                ids.extend(tok)
                pos.extend(range(s, s + m))
                smap.extend([pages[p // ps] * ps + p % ps for p in range(s, s + m)])
                if virtual:
                    rsl.extend([sl] * m)
            else:
                flush()
                try:
                    ids_v[t : t + m] = tok
                except (OverflowError, ValueError, TypeError):
                    _bad_token(known, part)
                    raise
                p = np.arange(s, s + m)
                pos_v[t : t + m] = p
                first = s // ps
                pg = np.asarray(pages[first : (s + m - 1) // ps + 1], np.int64)
                smap_v[t : t + m] = pg[p // ps - first] * ps + p % ps
                if virtual:
                    rsl_v[t : t + m] = sl
                flushed = t + m
        t += m
        cu.append(t)
        qmax = m if m > qmax else qmax
        row = rows[live[k]]
        if not virtual:
            seqs.append(s + m)
            rsl.append(sl)
        if virtual or row.sample:
            if row.sample:
                oslot.append(sl)
                p = req.sampling
                if p.temperature > 0:
                    samp.append((len(li), p))
                if p.logprobs is not None:
                    lpk.append((len(li), min(p.logprobs, ctx.vocab_size)))
            else:
                oslot.append(0)
            li.append(t - 1)
            spos.append(s + m)
    flush()
    if prev_at:
        prev_v[prev_at] = prev_src
    bad = (ids_v[:t] < 0) | (ids_v[:t] >= ctx.vocab_size)
    if bad.any():
        _bad_token(known, part)
    if virtual:
        np.add(pos_v[:t], 1, out=seq_v[:t])  # one virtual decode row per token
    else:  # varlen; a varlen graph's padding rows (past the list) keep seq_len 1, slot 0 and zero queries
        seq_v[: len(seqs)] = seqs
        rsl_v[: len(rsl)] = rsl
        cu_v = view("cu_seqlens_q")
        cu_v[: len(cu)] = cu
        cu_v[len(cu) :] = t
    nl = len(li)
    view("logits_indices")[:nl] = li
    view("out_slot")[:nl] = oslot
    view("sample_pos")[:nl] = spos
    top_p = view("top_p").view(np.float32)
    top_p[:nl] = 1.0
    if samp:
        write_sampling(samp, ctx, top_p, view("inv_temp").view(np.float32), view("top_k"), view("seed"))
    if lpk:
        write_logprobs(lpk, view("logprobs_k1"))
    n_upd = len(upd[0])
    if n_upd:
        view("upd_idx")[:n_upd] = upd[0]
        view("upd_val")[:n_upd] = upd[1]
    return qmax


def _bad_token(known: _PlanRows, part: list[int]) -> None:
    """Slow path after a packed token id failed the vocabulary check: find the first bad one and name its row."""
    vocab = known.ctx.vocab_size
    c = known.checked
    for k in part:
        if k < 0 or k in known.prev_slot:
            continue
        for tok in c.reqs[k].token_ids[c.starts[k] : c.starts[k] + c.ntok[k]]:
            if not (isinstance(tok, int | np.integer) and 0 <= tok < vocab):
                raise BatchError(f"{known.name(k)}: token id {tok} outside the vocabulary (0..{vocab - 1})",
                                 (c.reqs[k].rid,))  # fmt: skip
