"""Host planner: the decode fast path (`decode_plan`) returns exactly the general planner's plan, falls back for
every row it does not handle, and never hides a bad row (the general planner names it)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.decode_plan import plan_decode
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.page_table import PageTable
from tokenrouter.engine.step_plan import PlanContext, plan_step

PS, VOCAB = 4, 500
PARAMS = [SamplingParams(), SamplingParams(0.7, 0.9, 20, seed=3, logprobs=5), SamplingParams(1.1),
          SamplingParams(0.5, top_k=900), SamplingParams(logprobs=0)]  # fmt: skip


def _setup(n_req: int = 10, slots: int = 41, buckets=(1, 2, 4, 8, 16)):
    pool = KVPool(400, PS)
    table = PageTable(slots, 64, pool.num_pages, torch.device("cpu"))
    ctx = PlanContext(PS, 250, VOCAB, GraphRule(buckets=buckets), table, [-1] * slots, max(buckets), random.Random(1))
    reqs = [Request(f"r{i}", [(7 * i + j) % VOCAB for j in range(3 + 2 * i)], 3 + 2 * i,
                    sampling=PARAMS[i % len(PARAMS)]) for i in range(n_req)]  # fmt: skip
    return pool, table, ctx, reqs


def _buf(g: int, e: int) -> np.ndarray:
    return np.empty(g + e, np.int32)


def _both(batch, ctx):
    """(fast plan or None, general plan), from the same RNG state; fields compared as packed bytes."""
    state = ctx.rng.getstate()
    fast = plan_decode(batch, ctx, lambda g, e: np.full(g + e + 8, 99, np.int32))
    after = ctx.rng.getstate()
    ctx.rng.setstate(state)
    ref = plan_step(batch, ctx, lambda g, e: np.full(g + e + 8, 77, np.int32), fast=False)
    assert fast is None or ctx.rng.getstate() == after
    return fast, ref


def _same(a, b):
    assert (a.graph is None) == (b.graph is None) and b.eager is None
    assert a.graph.layout == b.graph.layout and a.graph.bucket == b.graph.bucket
    assert a.graph.packed.tolist() == b.graph.packed.tolist()
    assert a.graph.rows == b.graph.rows and a.graph.max_q_len == b.graph.max_q_len and b.graph.extra_upd is None
    assert a.out_index.tolist() == b.out_index.tolist() and a.sampled == b.sampled and a.skipped == b.skipped
    assert a.sampled_slots == b.sampled_slots and a.num_tokens == b.num_tokens and a.logprobs == b.logprobs
    assert [id(r) for r in a.live_reqs] == [id(r) for r in b.live_reqs]
    ta, tb = a.table, b.table
    assert (ta.slots, ta.upd_idx, ta.upd_val, ta.written, ta.claims) == (tb.slots, tb.upd_idx, tb.upd_val,
                                                                          tb.written, tb.claims)  # fmt: skip
    assert not (tb.new_owner or tb.evict or tb.taken)


def _commit(table, ctx, plan, step_id):
    table.commit(plan.table)
    for s in plan.sampled_slots:
        ctx.slot_token_step[s] = step_id


def test_fast_path_equals_general_planner_over_a_decode_run():
    pool, table, ctx, reqs = _setup()
    for r in reqs:
        pool.grow(r.pages, r.num_tokens)
    plan = plan_step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs]), ctx, _buf)
    _commit(table, ctx, plan, 0)
    g = random.Random(4)
    fast_steps = 0
    for step in range(1, 40):
        for r in reqs:
            r.token_ids.append(g.randrange(VOCAB))
            pool.grow(r.pages, r.num_tokens)
        rows = []
        for r in g.sample(reqs, g.randint(1, len(reqs))):  # any order, any subset
            from_prev = bool(ctx.slot_token_step[table.slot_of(r)] == step - 1 and g.random() < 0.5)
            rows.append(BatchRow(r, r.num_tokens - 1, 1, sample=g.random() < 0.8, from_prev=from_prev))
        if step % 9 == 0:  # a failed step left slots half-written: pages are rewritten through the fast path too
            table.forget([rows[0].req])
            table.written[table.slot_of(rows[0].req)] = 1
        batch = Batch(0, step, rows)
        fast, ref = _both(batch, ctx)
        if fast is not None:
            fast_steps += 1
            _same(fast, ref)
        _commit(table, ctx, ref, step)
        for row in rows:
            row.req.num_computed = row.req.num_tokens
    assert fast_steps >= 30


def test_fast_path_falls_back_and_names_bad_rows():
    pool, table, ctx, reqs = _setup(4)
    for r in reqs:
        pool.grow(r.pages, r.num_tokens + 8)
    plan = plan_step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs]), ctx, _buf)
    _commit(table, ctx, plan, 0)
    for r in reqs:
        r.token_ids.append(5)

    def dec(**kw):
        return [BatchRow(r, r.num_tokens - 1, 1, **kw) for r in reqs]

    ok = Batch(0, 1, dec())
    assert plan_decode(ok, ctx, _buf) is not None
    rows = dec()
    rows[2] = BatchRow(reqs[1], reqs[1].num_tokens - 1, 1)
    with pytest.raises(BatchError, match="rows 1 and 2: request r1 appears twice"):
        plan_step(Batch(0, 1, rows), ctx, _buf)
    reqs[3].token_ids[-1] = VOCAB
    with pytest.raises(BatchError, match="row 3 \\(request r3\\): token id 500 outside"):
        plan_step(Batch(0, 1, dec()), ctx, _buf)
    reqs[3].token_ids[-1] = 1 << 40
    with pytest.raises(BatchError, match="row 3 \\(request r3\\): token id"):
        plan_step(Batch(0, 1, dec()), ctx, _buf)
    reqs[3].token_ids[-1] = 5
    sampling = reqs[2].sampling
    reqs[2].sampling = SamplingParams(logprobs=21)
    assert plan_decode(Batch(0, 1, dec()), ctx, _buf) is None
    with pytest.raises(BatchError, match=r"row 2 \(request r2\): logprobs 21 outside 0\.\.20"):
        plan_step(Batch(0, 1, dec()), ctx, _buf)
    reqs[2].sampling = sampling
    with pytest.raises(BatchError, match="row 0 \\(request r0\\): from_prev row, but step 2"):
        plan_step(Batch(0, 3, dec(from_prev=True)), ctx, _buf)
    saved = reqs[2].pages[-1]
    reqs[2].pages[-1] = reqs[1].pages[0]  # row 2 enters a page that row 1 holds
    reqs[2].token_ids += [1] * (PS * len(reqs[2].pages) - reqs[2].num_tokens)
    rows = dec()
    with pytest.raises(BatchError, match="both hold KV page"):
        plan_step(Batch(0, 1, rows), ctx, _buf)
    reqs[2].pages[-1] = saved
    del reqs[2].token_ids[reqs[2].prompt_len + 1 :]
    # Nothing changed: the valid batch plans as before, through the fast path.
    fast, ref = _both(ok, ctx)
    assert fast is not None
    _same(fast, ref)


def test_slots_run_out_evict_the_least_recent_and_tables_stay_right():
    """3 usable slots for 6 requests taking turns: every step, each row's slot holds exactly its pages (the
    planned writes applied as the device prologue would), and the victim is the least recently run slot."""
    pool, table, ctx, reqs = _setup(6, slots=4)
    for r in reqs:
        pool.grow(r.pages, 200)
    g = random.Random(2)
    pos = {r.rid: 0 for r in reqs}
    evictions = 0
    for step in range(60):
        batch_reqs = g.sample(reqs, g.randint(1, 3))
        rows = []
        for r in batch_reqs:
            n = g.choice([1, 1, 3]) if pos[r.rid] else r.num_tokens
            r.token_ids += [1] * max(0, pos[r.rid] + n - r.num_tokens)
            rows.append(BatchRow(r, pos[r.rid], n))
        before = list(table.stamp)
        plan = plan_step(Batch(0, step, rows), ctx, _buf)
        evictions += len(plan.table.evict)
        for s in plan.table.evict:  # least recently run among slots not in this batch
            others = [x for x in range(1, 4) if x not in plan.table.slots or x == s]
            assert before[s] == min(before[x] for x in others if table.owner[x] not in batch_reqs or x == s)
        table.table.view(-1)[torch.as_tensor(plan.table.upd_idx, dtype=torch.long)] = torch.as_tensor(
            plan.table.upd_val, dtype=torch.int32
        )
        _commit(table, ctx, plan, step)
        for row, s in zip(rows, plan.table.slots, strict=True):
            need = -(-(row.start + row.num_tokens) // PS)
            assert table.table[s, :need].tolist() == row.req.pages[:need]
            pos[row.req.rid] = row.start + row.num_tokens
    assert evictions > 10
