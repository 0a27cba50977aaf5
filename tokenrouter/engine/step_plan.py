"""Host side of one step: validate a `Batch`, split it into a graph and an eager part by the `GraphRule`, plan the
page-table writes and pack each part (docs/engine.md, Host planning and Safety). Errors name the row before
anything changes. Host cost is O(rows + fed tokens + new pages); seeds are drawn graph part first."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.request import Request
from tokenrouter.engine.decode_plan import plan_decode
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import Layout, graph_layout
from tokenrouter.engine.page_table import TablePlan
from tokenrouter.engine.part_writer import CheckedRows, Part, PlanRows, write_part
from tokenrouter.engine.plan_types import PartPlan, PlanContext, StepPlan, logprobs_asked
from tokenrouter.engine.sampler import MAX_LOGPROBS
from tokenrouter.engine.varlen_shapes import VarlenShape

_Upd = tuple[list[int], list[int]]  # page-table writes of one part: (flat index slot * width + column, page)


def plan_step(batch: Batch, ctx: PlanContext, staging: Callable[[int, int], np.ndarray], *,
              fast: bool = True) -> StepPlan:  # fmt: skip
    """`staging(graph_size, eager_size)`: an int32 host buffer of at least their sum (called once, after every row
    validated). `fast`: try `decode_plan.plan_decode` first (the same plan; False: the reference for tests)."""
    rows = batch.rows
    if not rows:
        raise BatchError("empty batch")
    if fast:
        plan = plan_decode(batch, ctx, staging)
        if plan is not None:
            return plan
    checked = _check_rows(rows, ctx)
    table_plan = ctx.table.plan(checked.reqs, checked.starts, checked.npages, checked.name)
    prev_slot = _from_prev_slots(batch.step_id, ctx, checked, table_plan.slots)
    g_idx, e_idx = _split_rows(ctx.rule, checked)
    bucket = ctx.rule.bucket_for(sum(checked.ntok[k] for k in g_idx)) if g_idx else None
    g_upd, e_upd = _split_updates(table_plan, g_idx, e_idx, ctx.table.width)
    g_layout = graph_layout(bucket) if bucket is not None else None
    e_layout, shape, e_part = _varlen_layout(rows, ctx, checked, e_idx, len(e_upd[0]))
    g_size = g_layout.size if g_layout else 0
    buf = staging(g_size, e_layout.size if e_layout else 0)
    known = PlanRows(rows, ctx, checked, table_plan.slots, prev_slot)
    out_index = [-1] * len(rows)
    graph = eager = None
    if g_layout is not None:
        assert bucket is not None
        graph = _graph_part(known, g_idx, g_layout, buf[:g_size], g_upd, bucket, out_index)
    if e_layout is not None:
        packed = buf[g_size : g_size + e_layout.size]
        eager = _varlen_part(known, e_part, e_layout, packed, e_upd, shape, out_index)
    return _step_plan(known, table_plan, graph, eager, out_index)


def _from_prev_slots(step_id: int, ctx: PlanContext, checked: CheckedRows, slots: list[int]) -> dict[int, int]:
    """Live index of each from_prev row -> the slot holding its token: step step_id - 1 must have sampled the
    request into the slot it holds now, else BatchError (never an older token)."""
    prev_slot: dict[int, int] = {}
    want, ledger, owner, reqs = step_id - 1, ctx.slot_token_step, ctx.table.owner, checked.reqs
    for k in checked.from_prev:
        s = slots[k]
        if owner[s] is not reqs[k] or ledger[s] != want:
            raise BatchError(f"{checked.name(k)}: from_prev row, but step {want} of this engine did not sample "
                             "this request (failed, skipped or never run)", (reqs[k].rid,))  # fmt: skip
        prev_slot[k] = s
    return prev_slot


def _split_rows(rule: GraphRule, checked: CheckedRows) -> tuple[list[int], list[int]]:
    """(graph part, eager part) live indices by the rule; the common all-fit case skips `rule.split`."""
    everything = list(range(len(checked.live)))
    if not rule.enabled:
        return [], everything
    if checked.longest <= rule.max_row_tokens and checked.total <= rule.max_tokens:
        return everything, []  # every row fits and the room never runs out: what rule.split returns
    return rule.split(checked.ntok)


def _split_updates(table_plan: TablePlan, g_idx: list[int], e_idx: list[int], width: int) -> tuple[_Upd, _Upd]:
    """Page-table writes go with the part whose rows own the slot (graph part's, eager part's)."""
    g_upd: _Upd = ([], [])
    e_upd: _Upd = ([], [])
    if not table_plan.upd_idx:
        return g_upd, e_upd
    if not e_idx:
        return (table_plan.upd_idx, table_plan.upd_val), e_upd
    if not g_idx:
        return g_upd, (table_plan.upd_idx, table_plan.upd_val)
    slots = table_plan.slots
    gs = {slots[k] for k in g_idx}
    for f, v in zip(table_plan.upd_idx, table_plan.upd_val, strict=True):
        dst = g_upd if f // width in gs else e_upd
        dst[0].append(f)
        dst[1].append(v)
    return g_upd, e_upd


def _varlen_layout(rows: list[BatchRow], ctx: PlanContext, checked: CheckedRows, e_idx: list[int],
                   n_upd: int) -> tuple[Layout | None, VarlenShape | None, list[int]]:  # fmt: skip
    """(layout, varlen graph shape or None: eager, attention-row order with -1 for padding) of the eager part."""
    if not e_idx:
        return None, None, e_idx
    ntok = checked.ntok
    fit = ctx.varlen.fit([ntok[k] for k in e_idx]) if ctx.varlen is not None else None
    if fit is not None:
        shape, order = fit
        return shape.layout, shape, [e_idx[o] if o >= 0 else -1 for o in order]
    live = checked.live
    e_logits = sum(1 for k in e_idx if rows[live[k]].sample)
    return Layout(sum(ntok[k] for k in e_idx), len(e_idx), e_logits, n_upd, varlen=True), None, e_idx


def _graph_part(known: PlanRows, g_idx: list[int], layout: Layout, packed: np.ndarray, upd: _Upd, bucket: int,
                out_index: list[int]) -> PartPlan:  # fmt: skip
    """Pack the decode-graph part; its logit row j is batch row live[g_idx[j]]'s output index when it samples."""
    upd, extra = _cap_updates(upd, layout.num_updates)
    qmax = write_part(known, Part(g_idx, layout, packed, upd, virtual=True))
    live, rows = known.checked.live, known.rows
    for j, k in enumerate(g_idx):
        if rows[live[k]].sample:
            out_index[live[k]] = j
    return PartPlan(layout, packed, [live[k] for k in g_idx], qmax, bucket, extra)


def _varlen_part(known: PlanRows, e_part: list[int], layout: Layout, packed: np.ndarray, upd: _Upd,
                 shape: VarlenShape | None, out_index: list[int]) -> PartPlan:  # fmt: skip
    """Pack the varlen part; its sampled rows take output indices from `eager_out_base` on."""
    extra = None
    if shape is not None:
        upd, extra = _cap_updates(upd, layout.num_updates)
    qmax = write_part(known, Part(e_part, layout, packed, upd, virtual=False))
    real = [k for k in e_part if k >= 0]
    live, rows = known.checked.live, known.rows
    j = known.ctx.eager_out_base
    for k in real:
        if rows[live[k]].sample:
            out_index[live[k]] = j
            j += 1
    return PartPlan(layout, packed, [live[k] for k in real], qmax, shape.tokens if shape else None, extra, shape)


def _step_plan(known: PlanRows, table_plan: TablePlan, graph: PartPlan | None, eager: PartPlan | None,
               out_index: list[int]) -> StepPlan:  # fmt: skip
    """The plan of the packed parts; sampled rows (and their log-probability requests) in batch order."""
    c, rows, slots = known.checked, known.rows, known.slots
    live, reqs = c.live, c.reqs
    sampled = [k for k in range(len(live)) if rows[live[k]].sample]
    vocab = known.ctx.vocab_size
    asked = [(live[k], min(n, vocab)) for k in sampled if (n := logprobs_asked(reqs[k])) is not None]
    return StepPlan(graph, eager, table_plan, np.asarray(out_index, np.int64), [live[k] for k in sampled],
                    c.skipped, reqs, c.total, [slots[k] for k in sampled], asked)  # fmt: skip


def _cap_updates(upd: _Upd, cap: int) -> tuple[_Upd, tuple[np.ndarray, np.ndarray] | None]:
    """Page writes a graph replay carries (the first `cap`) and the rest, scattered before the replay."""
    if len(upd[0]) <= cap:
        return upd, None
    extra = (np.asarray(upd[0][cap:], np.int64), np.asarray(upd[1][cap:], np.int64))
    return (upd[0][:cap], upd[1][:cap]), extra


def _check_rows(rows: list[BatchRow], ctx: PlanContext) -> CheckedRows:
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
    return CheckedRows(live, reqs, starts, ntok, npages, from_prev, skipped, total, longest)
