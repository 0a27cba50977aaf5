#!/usr/bin/env python
"""Host planning cost of one engine step: `plan_step` + `PageTable.commit` + the from_prev ledger update, the
host work `Engine.step` does before and after launching (no device work: the page table lives on the CPU).

    python studies/engine/plan_bench.py                 # b = 8, 64, 256 at context 1k and 8k, ~20 s
    python studies/engine/plan_bench.py --steps 200

Reports this thread's CPU time per step (`time.thread_time`, median over the steps after the first): a loaded
shared machine inflates wall time, not this. Cases: `decode` (plain decode rows, the host knows the token),
`from_prev` (overlap: every row takes the token the previous step sampled), `sampled` (temperature 0.8, top-p,
top-k, per-request seed). Each step advances every request by one token, so a row crosses a page boundary
every `page_size` steps, as in serving.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.page_table import PageTable
from tokenrouter.engine.step_plan import PlanContext, plan_step

PAGE = 16
VOCAB = 151936


def bench(rows: int, ctx: int, steps: int, case: str) -> tuple[float, float]:
    """(cold ms, median thread-CPU ms) of `steps` decode steps of `rows` rows at context `ctx`."""
    per = -(-(ctx + PAGE + steps + 8) // PAGE)
    pool = KVPool(rows * per + 2, PAGE)
    sp = SamplingParams(0.8, 0.9, 50, seed=7) if case == "sampled" else SamplingParams()
    # contexts staggered over a page, so every step has about rows / PAGE rows crossing into a new page
    reqs = [Request(f"p{i}", [1] * (ctx + i % PAGE), ctx, sampling=sp) for i in range(rows)]
    for r in reqs:
        pool.grow(r.pages, len(r.token_ids))
    table = PageTable(4 * rows + 1, per, pool.num_pages, torch.device("cpu"))
    ledger = [-1] * table.num_slots
    pctx = PlanContext(PAGE, ctx + PAGE + steps + 8, VOCAB, EngineConfig("qwen3-0.6b").graph_rule(), table, ledger, 256,
                       random.Random(0))  # fmt: skip
    buf = np.empty(1 << 22, np.int32)
    cpu: list[float] = []
    for step in range(steps):
        for r in reqs:
            pool.grow(r.pages, len(r.token_ids))
        fp = case == "from_prev" and step > 0
        batch = Batch(0, step, [BatchRow(r, len(r.token_ids) - 1, 1, from_prev=fp) for r in reqs])
        c = time.thread_time()
        plan = plan_step(batch, pctx, lambda g, e: buf)
        table.commit(plan.table)
        for s in plan.sampled_slots:  # as Engine.step does after the launch
            ledger[s] = batch.step_id
        cpu.append(time.thread_time() - c)
        for r in reqs:
            r.token_ids.append(1)
    return 1e3 * cpu[0], 1e3 * statistics.median(cpu[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batches", default="8,64,256")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--cases", default="decode,from_prev,sampled")
    a = ap.parse_args()
    print(f"{'case':<10} {'rows':>5} {'ctx':>6} {'cold_ms':>8} {'cpu_ms':>8}  (thread CPU per step, median)")
    for case in a.cases.split(","):
        for ctx in map(int, a.contexts.split(",")):
            for rows in map(int, a.batches.split(",")):
                cold, med = bench(rows, ctx, a.steps, case)
                print(f"{case:<10} {rows:>5} {ctx:>6} {cold:>8.3f} {med:>8.3f}")


if __name__ == "__main__":
    main()
