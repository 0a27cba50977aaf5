#!/usr/bin/env python
"""Tensor parallelism of the large model on two GPUs: the b=1 graph decode step at tp=1 and at tp=2, and greedy
tokens of tp=2 against tp=1.

    python studies/two_gpus/tp_bench.py --out tp_bench.json               # >= 2 CUDA GPUs: qwen3-32b, dummy weights
    python studies/two_gpus/tp_bench.py > tp_bench.json                   # the same, JSON on stdout
    python studies/two_gpus/tp_bench.py --device cpu --model tiny-large   # CPU smoke: gloo, 2 processes, seconds

This process is rank 0; at tp=2 it starts rank 1 as a spawned child (`runtime.tp_ranks.TPRanks`, the serving
runtime's own code), on cuda:1 (CPU: the CPU, gloo). The tp=1 engine is closed before the tp=2 one is built, so
rank 0's GPU holds one copy of the model at a time.

Timing: one decode row of `--context` tokens (KV pages allocated, contents arbitrary), run as the decode graph of
bucket 1, `--steps` times after `--warmup` steps; each step is waited for before the next is launched, and its
time is taken with CUDA events on the engine's stream around `Engine.step` (CPU: the host clock). So a step's time
includes rank 0's host planning and, at tp=2, sending the step's description to rank 1: the path a step takes
when serving without overlap. The median is reported (`*_b1_step_ms`), with the host wall time per step beside.

Greedy check: `--num-prompts` fixed prompts, prefilled together, then decoded together (one graph bucket) for
`--tokens` tokens each, at temperature 0, at both sizes; `tp2_greedy_equal` is true when every token is equal.
bf16 on GPU sums the row-parallel partial products in another order than tp=1 does, so a near-tie of two logits
may flip a token; `tp2_greedy_first_diff` says where (prompt, position), `tp2_greedy_match_frac` how much agreed.

JSON: tp1_b1_step_ms, tp2_b1_step_ms, tp2_over_tp1_b1 (tp=2 step time / tp=1 step time: below 1 is faster; the
goal is <= 0.6), tp2_greedy_equal, prompts, tokens, gpu, torch, date, command, and details. The summary goes to
stderr, so stdout stays pure JSON when --out is not given.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.runner import Engine
from tokenrouter.models import load_spec

PROMPT_LENS = (7, 16, 11, 23, 5, 19, 13, 9)  # fixed; prompt k takes the first `--num-prompts` of these


def make_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    """`n` fixed prompts (seeded token ids, lengths from PROMPT_LENS)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (PROMPT_LENS[k % len(PROMPT_LENS)],), generator=g).tolist() for k in range(n)]


def engine_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """One config for both sizes (and both ranks): dummy weights of one seed, so tp=2's shards are tp=1's tensors."""
    cuda = a.device == "cuda"
    max_ctx = max(a.context + 8, max(PROMPT_LENS) + a.tokens + 8)
    pages_per_row = math.ceil(max_ctx / a.page_size)
    kw: dict[str, Any] = {
        "model": a.model, "load_format": "dummy", "seed": a.seed, "device": "cuda:0" if cuda else "cpu",
        "dtype": a.dtype or ("bfloat16" if cuda else "float32"), "page_size": a.page_size,
        "num_pages": (a.num_prompts + 2) * pages_per_row + 8, "max_context_len": max_ctx,
        "graph_buckets": (1, 2, 4, 8), "varlen_graphs": False,  # prefill runs eager: a shorter start-up
    }  # fmt: skip
    if cuda:
        kw["cuda_graphs"] = True
    else:  # no CUDA graphs on CPU: the same padded static-buffer path, run eagerly
        kw.update(cuda_graphs=False, graph_emulation=True, attention_backend="torch")
    return kw


def build(tp: int, kw: dict[str, Any]) -> Engine:
    """A tp=1 engine, or rank 0 of a tp=`tp` engine whose followers this call starts (closed with the engine)."""
    if tp == 1:
        return Engine(EngineConfig(**kw))
    from tokenrouter.runtime.tp_ranks import TPRanks

    ranks = TPRanks(tp, kw, timeout_s=600)
    try:
        return Engine(EngineConfig(**kw), tp=ranks.tp, followers=ranks)
    except BaseException:
        ranks.close(timeout_s=0.0)
        raise


def time_b1_decode(eng: Engine, context: int, steps: int, warmup: int, first_step_id: int) -> dict[str, Any]:
    """Median time of a b=1 decode step through the decode graph (see the module doc); ms."""
    vocab = eng.spec.vocab_size
    req = Request("timed", [(7 * j + 3) % vocab for j in range(context)], context)
    if not eng.kv_pool.grow(req.pages, context):
        raise RuntimeError(f"KV pool cannot hold {context} tokens")
    row = BatchRow(req, context - 1, 1)
    bucket = eng.graph_bucket_for(Batch(0, 0, [row]))
    if bucket != 1:
        raise RuntimeError(f"a b=1 decode step does not run in the bucket-1 graph (bucket {bucket})")
    stream = eng.stream if eng.device.type == "cuda" else None
    dev_ms: list[float] = []
    wall_ms: list[float] = []
    try:
        for i in range(warmup + steps):
            batch = Batch(0, first_step_id + i, [BatchRow(req, context - 1, 1)])
            if stream is not None:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
            t = time.perf_counter()
            h = eng.step(batch)
            if stream is not None:
                b.record(stream)
            h.wait()
            wall = (time.perf_counter() - t) * 1e3
            if i >= warmup:
                wall_ms.append(wall)
                if stream is not None:
                    b.synchronize()
                    dev_ms.append(a.elapsed_time(b))
    finally:
        eng.synchronize()
        eng.kv_pool.release(req.pages)
    step = statistics.median(dev_ms) if dev_ms else statistics.median(wall_ms)
    return {"step_ms": step, "wall_ms": statistics.median(wall_ms), "min_ms": min(dev_ms or wall_ms),
            "steps": steps, "timer": "cuda-events" if dev_ms else "host-clock"}  # fmt: skip


def greedy(eng: Engine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """`tokens` greedy tokens per prompt: one prefill step of every prompt, then decode steps of all of them."""
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    reqs = [Request(f"g{k}", list(p), len(p), sampling=sp) for k, p in enumerate(prompts)]
    pool = eng.kv_pool
    try:
        for step in range(tokens):
            rows = []
            for r in reqs:
                start = r.num_computed
                n = r.num_tokens - start
                if not pool.grow(r.pages, start + n):
                    raise RuntimeError("KV pool too small for the greedy prompts")
                rows.append(BatchRow(r, start, n))
            res = eng.step(Batch(0, step, rows)).result()
            for r, row, t in zip(reqs, rows, res.next_token_ids.tolist(), strict=True):
                r.num_computed = row.start + row.num_tokens
                r.token_ids.append(int(t))
    finally:
        eng.synchronize()
        for r in reqs:
            pool.release(r.pages)
    return [r.token_ids[r.prompt_len :] for r in reqs]


def run_size(tp: int, kw: dict[str, Any], a: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    eng = build(tp, kw)
    try:
        startup = time.perf_counter() - t0
        log(f"tp={tp}: engine ready in {startup:.1f} s ({eng.num_pages} pages, graphs {eng.graphs_enabled})")
        out = greedy(eng, prompts, a.tokens)  # step ids 0..tokens-1; the timed steps follow
        timing = time_b1_decode(eng, a.context, a.steps, a.warmup, first_step_id=a.tokens)
        log(f"tp={tp}: b=1 decode step {timing['step_ms']:.3f} ms ({timing['timer']}), wall {timing['wall_ms']:.3f}")
    finally:
        eng.close()
        del eng
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"startup_s": round(startup, 2), "timing": timing, "greedy": out}


def compare(ref: list[list[int]], got: list[list[int]]) -> tuple[bool, float, list[int] | None]:
    """(all equal, fraction of positions equal, first (prompt, position) that differs or None)."""
    total = same = 0
    first = None
    for k, (x, y) in enumerate(zip(ref, got, strict=True)):
        for j, (u, v) in enumerate(zip(x, y, strict=True)):
            total += 1
            same += u == v
            if u != v and first is None:
                first = [k, j]
    return same == total, same / max(total, 1), first


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    names = [torch.cuda.get_device_name(i) for i in range(min(2, torch.cuda.device_count()))]
    return " + ".join(names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-32b", help="bundled model name (dummy weights); tiny-large for a smoke")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: ranks on cuda:0 and cuda:1 (NCCL); cpu: both ranks on the CPU (gloo)")  # fmt: skip
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--context", type=int, default=1024, help="KV length of the timed b=1 decode row")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps (the median is reported)")
    p.add_argument("--warmup", type=int, default=20, help="decode steps run before timing")
    p.add_argument("--num-prompts", type=int, default=4, help="fixed prompts of the greedy check (at most 8)")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="dummy weights' seed (the same at both sizes)")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    a = p.parse_args(argv)
    if not 1 <= a.num_prompts <= len(PROMPT_LENS):
        p.error(f"--num-prompts must be in 1..{len(PROMPT_LENS)}")
    if a.device == "cuda" and torch.cuda.device_count() < 2:
        p.error(f"--device cuda needs >= 2 CUDA GPUs, found {torch.cuda.device_count()}")
    if a.device == "cpu":
        torch.set_num_threads(1)  # as the CPU follower does (runtime.tp_ranks): two processes share the cores

    kw = engine_kwargs(a)
    prompts = make_prompts(load_spec(a.model).vocab_size, a.num_prompts, a.seed + 1)
    log(f"tp_bench: {a.model} on {a.device} ({gpu_name(a.device)}), context {a.context}, {a.steps} steps")
    one = run_size(1, kw, a, prompts)
    two = run_size(2, kw, a, prompts)
    equal, frac, first = compare(one["greedy"], two["greedy"])
    t1, t2 = one["timing"]["step_ms"], two["timing"]["step_ms"]
    result = {
        "tp1_b1_step_ms": round(t1, 4),
        "tp2_b1_step_ms": round(t2, 4),
        "tp2_over_tp1_b1": round(t2 / t1, 4),
        "tp2_greedy_equal": equal,
        "prompts": prompts,
        "tokens": a.tokens,
        "gpu": gpu_name(a.device),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["tp_bench.py", *argv]),
        "tp2_greedy_match_frac": round(frac, 4),
        "tp2_greedy_first_diff": first,
        "model": a.model,
        "device": a.device,
        "dtype": kw["dtype"],
        "context": a.context,
        "tp1": {"startup_s": one["startup_s"], "timing": one["timing"], "greedy": one["greedy"]},
        "tp2": {"startup_s": two["startup_s"], "timing": two["timing"], "greedy": two["greedy"]},
    }
    where = "" if first is None else f", first diff at prompt {first[0]} token {first[1]}"
    log(f"SUMMARY tp_bench {a.model} {a.device}: b=1 decode step tp1 {t1:.3f} ms, tp2 {t2:.3f} ms, tp2/tp1 "
        f"{t2 / t1:.3f} (goal <= 0.6); greedy tp2 == tp1 over {a.num_prompts}x{a.tokens} tokens: {equal} "
        f"({frac:.1%} equal{where})")  # fmt: skip
    text = json.dumps(result, indent=1)
    if a.out is None:
        print(text, flush=True)
    else:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
        log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
