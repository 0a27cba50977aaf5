"""Paged-attention micro-benchmark on one GPU (reference: H200, torch 2.11, Triton 3.6).

    python studies/engine/attention_bench.py --out OUT_DIR [--no-sweep]
    TRITON_INTERPRET=1 python studies/engine/attention_bench.py --smoke --out /tmp/ab   # CPU plumbing check

1. Correctness: bf16 Triton decode/extend vs the fp32 torch reference on fresh random inputs (max relative
   error = max|out - ref| / max|ref|), including CUDA-graph replays after seq_lens/page tables change.
2. Decode timings: batch 1..32 x context 1k/8k, Qwen3-8B heads (32/8, D 128) and Qwen3-0.6B (16/8),
   page 16, shuffled pages. `kernel` = do_bench median of one eager call (L2 flushed, launch latency mostly
   hidden behind the flush), `graph` = median of replaying a captured call, `eager` = back-to-back eager
   calls (what an uncaptured step pays: Python + launch overhead). GB/s = (K+V bytes read + q + out) /
   time, next to the 4,255 GB/s device copy ceiling (studies/calibration/README.md).
3. Extend timings: 1/4/8 new tokens per row on 1k/8k prefixes (graph replay), next to the same tokens run
   as "virtual decode" rows (one decode row per token, as the engine's graph path does); one 2k prefill.
4. Optional small sweep of tile configs (decode and prefill) to tune the defaults.
Prints a short table; writes attention_bench.csv (every measurement) to --out.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

try:
    import tokenrouter  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling graph_timing module
from graph_timing import capture_graph

COPY_CEILING_GBPS = 4255.0
PASS_REL_ERR = 2e-2  # bf16 inputs/outputs and bf16 P in the PV product vs an fp32 reference


@dataclass(frozen=True)
class Plan:
    models: dict[str, tuple[int, int, int]]  # name -> (Hq, Hkv, D)
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    extend_q: tuple[int, ...]
    extend_batches: tuple[int, ...]
    prefill_len: int
    page_size: int
    check_lens: tuple[int, ...]
    dtype: torch.dtype
    device: str
    sweep: bool


GPU_PLAN = Plan(
    models={"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)},
    batches=(1, 4, 8, 16, 32),
    contexts=(1024, 8192),
    extend_q=(1, 4, 8),
    extend_batches=(1, 8),
    prefill_len=2048,
    page_size=16,
    check_lens=(1, 17, 1000, 4099),
    dtype=torch.bfloat16,
    device="cuda",
    sweep=True,
)
# Tiny shapes for the CPU interpreter: exercises every code path of this script except CUDA events/graphs.
SMOKE_PLAN = Plan(
    models={"tiny": (4, 2, 16)},
    batches=(1, 2),
    contexts=(32,),
    extend_q=(1, 3),
    extend_batches=(2,),
    prefill_len=24,
    page_size=4,
    check_lens=(1, 9, 30),
    dtype=torch.float32,
    device="cpu",
    sweep=True,
)


@dataclass
class Results:
    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append(row)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


# ------------------------------------------------------------------------------------------------ inputs


def make_cache(num_pages: int, hkv: int, d: int, plan: Plan, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_pages, plan.page_size, hkv, d)
    k = torch.randn(shape, generator=gen, device=plan.device, dtype=torch.float32).to(plan.dtype)
    v = torch.randn(shape, generator=gen, device=plan.device, dtype=torch.float32).to(plan.dtype)
    return k, v


def block_tables_for(seq_lens: list[int], width: int, num_pages: int, plan: Plan, gen: torch.Generator) -> torch.Tensor:
    """Distinct shuffled pages from 1..num_pages-1 per row; unused entries point at the null page 0."""
    need = [-(-n // plan.page_size) for n in seq_lens]
    if sum(need) > num_pages - 1 or max(need, default=0) > width:
        raise ValueError("page pool or table width too small for these lengths")
    perm = (torch.randperm(num_pages - 1, generator=gen, device=plan.device) + 1).to(torch.int32)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=plan.device)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used : used + n]
        used += n
    return table


def ivec(values: list[int], plan: Plan) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=plan.device)


def cu_of(q_lens: list[int], plan: Plan) -> torch.Tensor:
    return ivec([0, *[sum(q_lens[: i + 1]) for i in range(len(q_lens))]], plan)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12)).item()


# ------------------------------------------------------------------------------------------------ timing


@dataclass
class Timer:
    """GPU: triton do_bench medians and CUDA graphs. CPU smoke: one perf_counter run, graphs as eager."""

    cuda: bool

    def kernel_us(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3

    def eager_us(self, fn: Callable[[], object], iters: int = 30) -> float:
        """Back-to-back calls with no cache flush in between: bounded by host launch overhead when small."""
        if not self.cuda:
            return self.kernel_us(fn)
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / iters

    def capture(self, fn: Callable[[], object]) -> Callable[[], object]:
        """A replay callable for `fn` captured in a CUDA graph (fn must write into static buffers). Its time is
        taken by `kernel_us` (do_bench, L2 flushed) like the eager call's, so `graph` and `kernel` compare."""
        if not self.cuda:
            return fn
        graph, _ = capture_graph(fn)
        return graph.replay


def gbps(num_bytes: float, us: float) -> float:
    return num_bytes / (us * 1e-6) / 1e9 if us > 0 else float("nan")


# ------------------------------------------------------------------------------------------- correctness


def check_model(name: str, hq: int, hkv: int, d: int, plan: Plan, timer: Timer, gen: torch.Generator) -> list[tuple]:
    """(case, rel_err) pairs for one head configuration."""
    from tokenrouter.engine.attention import decode_attention, extend_attention
    from tokenrouter.engine.attention.reference import decode_attention_torch, extend_attention_torch

    found = []
    scale = d**-0.5
    lens = list(plan.check_lens)
    width = -(-max(lens) // plan.page_size) + 3
    num_pages = sum(-(-n // plan.page_size) for n in lens) * 2 + 8
    kc, vc = make_cache(num_pages, hkv, d, plan, gen)
    kf, vf = kc.float(), vc.float()
    bt = block_tables_for(lens, width, num_pages, plan, gen)
    sl = ivec(lens, plan)
    q = torch.randn(len(lens), hq, d, generator=gen, device=plan.device).to(plan.dtype)
    ref = decode_attention_torch(q.float(), kf, vf, bt, sl, scale)
    for splits in (None, 1, 7):
        out = decode_attention(q, kc, vc, bt, sl, scale, num_splits=splits, backend="triton")
        found.append((f"decode {name} splits={splits}", rel_err(out, ref)))

    # Extend: prefill, extend after a long prefix, a decode-like row, an idle row, a short extend.
    q_lens = [lens[2] // 3, 8, 1, 0, 5]
    prefixes = [0, lens[-1] - 8, lens[1], 3, lens[2]]
    seq = [p + n for p, n in zip(prefixes, q_lens, strict=True)]
    ext_width = -(-max(seq) // plan.page_size) + 2
    ext_pages = sum(-(-n // plan.page_size) for n in seq) + len(seq) + 4  # room for the replay's +1 token
    kc2, vc2 = make_cache(ext_pages, hkv, d, plan, gen)
    bt2 = block_tables_for(seq, ext_width, ext_pages, plan, gen)
    cu, sl2 = cu_of(q_lens, plan), ivec(seq, plan)
    qe = torch.randn(sum(q_lens), hq, d, generator=gen, device=plan.device).to(plan.dtype)
    ref2 = extend_attention_torch(qe.float(), kc2.float(), vc2.float(), bt2, cu, sl2, scale)
    max_q = max(q_lens)
    for splits in (None, 4):
        out = extend_attention(qe, kc2, vc2, bt2, cu, sl2, scale, max_q_len=max_q, num_splits=splits, backend="triton")
        found.append((f"extend {name} splits={splits}", rel_err(out, ref2)))

    # CUDA-graph safety: capture with one set of lengths/pages, replay with another.
    out_static = torch.empty_like(q)
    replay = timer.capture(lambda: decode_attention(q, kc, vc, bt, sl, scale, out=out_static, backend="triton"))
    new_lens = [max(1, n // 2 + 3) for n in reversed(lens)]
    bt.copy_(block_tables_for(new_lens, width, num_pages, plan, gen))
    sl.copy_(ivec(new_lens, plan))
    replay()
    found.append(
        (f"decode graph replay {name}", rel_err(out_static, decode_attention_torch(q.float(), kf, vf, bt, sl, scale)))
    )

    out_ext = torch.empty_like(qe)
    replay = timer.capture(
        lambda: extend_attention(qe, kc2, vc2, bt2, cu, sl2, scale, max_q_len=max_q, out=out_ext, backend="triton")
    )
    sl2.copy_(ivec([n + 1 for n in seq], plan))  # one more (already cached) token per row
    bt2.copy_(block_tables_for([n + 1 for n in seq], ext_width, ext_pages, plan, gen))
    replay()
    ref3 = extend_attention_torch(qe.float(), kc2.float(), vc2.float(), bt2, cu, sl2, scale)
    found.append((f"extend graph replay {name}", rel_err(out_ext, ref3)))
    return found


def check_correctness(plan: Plan, timer: Timer, res: Results) -> None:
    gen = torch.Generator(device=plan.device).manual_seed(1)
    found = []
    for name, (hq, hkv, d) in plan.models.items():
        found += check_model(name, hq, hkv, d, plan, timer, gen)
    for case, err in found:
        res.add(section="check", case=case, rel_err=err)
    worst = max(err for _, err in found)
    res.say(
        f"correctness: {len(found)} checks vs fp32 reference, max rel err {worst:.2e} "
        f"({'PASS' if worst < PASS_REL_ERR else 'FAIL'} at {PASS_REL_ERR:g})"
    )
    for case, err in found:
        if err >= PASS_REL_ERR:
            res.say(f"  FAIL {case}: {err:.2e}")


# ---------------------------------------------------------------------------------------------- decode


def bench_decode(plan: Plan, timer: Timer, res: Results) -> None:
    from tokenrouter.engine.attention import decode_attention
    from tokenrouter.engine.attention.triton_decode import decode_num_splits

    gen = torch.Generator(device=plan.device).manual_seed(2)
    max_tokens = max(plan.batches) * max(plan.contexts)
    hkv, d = next(iter(plan.models.values()))[1:]
    if any(m[1:] != (hkv, d) for m in plan.models.values()):
        raise ValueError("decode benchmark shares one KV pool: models must have equal (Hkv, D)")
    num_pages = max_tokens // plan.page_size + 1
    kc, vc = make_cache(num_pages, hkv, d, plan, gen)
    elt = kc.element_size()
    for name, (hq, _, _) in plan.models.items():
        for batch in plan.batches:
            cells = []
            for ctx in plan.contexts:
                width = ctx // plan.page_size
                bt = block_tables_for([ctx] * batch, width, num_pages, plan, gen)
                sl = ivec([ctx] * batch, plan)
                q = torch.randn(batch, hq, d, generator=gen, device=plan.device).to(plan.dtype)
                out = torch.empty_like(q)

                def call(q=q, bt=bt, sl=sl, out=out) -> None:
                    decode_attention(q, kc, vc, bt, sl, d**-0.5, out=out, backend="triton")

                kernel = timer.kernel_us(call)
                graph = timer.kernel_us(timer.capture(call))
                eager = timer.eager_us(call)
                num_bytes = batch * ctx * hkv * d * elt * 2 + 2 * batch * hq * d * elt
                splits = decode_num_splits(batch, hkv, width, plan.page_size, q.device)
                res.add(section="decode", model=name, batch=batch, ctx=ctx, splits=splits, kernel_us=kernel,
                        graph_us=graph, eager_us=eager, gbps=gbps(num_bytes, graph),
                        pct_ceiling=100 * gbps(num_bytes, graph) / COPY_CEILING_GBPS)  # fmt: skip
                cells.append(f"{graph:7.1f} {eager:6.1f} {gbps(num_bytes, graph):5.0f} {splits:2d}")
            res.say(f"{name:11s} B={batch:<3d}| " + " | ".join(cells))


# ---------------------------------------------------------------------------------------------- extend


def bench_extend(plan: Plan, timer: Timer, res: Results) -> None:
    from tokenrouter.engine.attention import decode_attention, extend_attention

    gen = torch.Generator(device=plan.device).manual_seed(3)
    name, (hq, hkv, d) = next(iter(plan.models.items()))
    scale = d**-0.5
    max_rows = max(plan.extend_batches)
    num_pages = max_rows * (max(plan.contexts) + max(plan.extend_q)) // plan.page_size + max_rows + 1
    kc, vc = make_cache(num_pages, hkv, d, plan, gen)
    elt = kc.element_size()
    for prefix in plan.contexts:
        for batch in plan.extend_batches:
            cells = []
            for n in plan.extend_q:
                seq = [prefix + n] * batch
                width = -(-(prefix + n) // plan.page_size)
                bt = block_tables_for(seq, width, num_pages, plan, gen)
                cu, sl = cu_of([n] * batch, plan), ivec(seq, plan)
                q = torch.randn(batch * n, hq, d, generator=gen, device=plan.device).to(plan.dtype)
                out = torch.empty_like(q)

                def call(q=q, bt=bt, cu=cu, sl=sl, out=out, n=n) -> None:
                    extend_attention(q, kc, vc, bt, cu, sl, scale, max_q_len=n, out=out, backend="triton")

                # The same tokens as "virtual decode" rows: token i of row b is a decode row at position
                # prefix + i over row b's page table.
                v_bt = bt.repeat_interleave(n, dim=0)
                v_sl = ivec([prefix + i + 1 for _ in range(batch) for i in range(n)], plan)
                v_out = torch.empty_like(q)

                def vcall(q=q, v_bt=v_bt, v_sl=v_sl, v_out=v_out) -> None:
                    decode_attention(q, kc, vc, v_bt, v_sl, scale, out=v_out, backend="triton")

                graph = timer.kernel_us(timer.capture(call))
                vgraph = timer.kernel_us(timer.capture(vcall))
                num_bytes = batch * (prefix + n) * hkv * d * elt * 2 + 2 * batch * n * hq * d * elt
                res.add(section="extend", model=name, batch=batch, ctx=prefix, q_len=n, graph_us=graph,
                        virtual_decode_us=vgraph, gbps=gbps(num_bytes, graph))  # fmt: skip
                cells.append(f"{graph:7.1f} {vgraph:7.1f}")
            res.say(f"prefix {prefix:5d} B={batch:<2d}| " + " | ".join(cells))

    # One fresh prefill (prefix 0), plus torch's dense flash SDPA on the same shape for scale.
    length = plan.prefill_len
    pages = -(-length // plan.page_size)
    kc, vc = make_cache(pages + 1, hkv, d, plan, gen)
    bt = block_tables_for([length], pages, pages + 1, plan, gen)
    cu, sl = cu_of([length], plan), ivec([length], plan)
    q = torch.randn(length, hq, d, generator=gen, device=plan.device).to(plan.dtype)
    out = torch.empty_like(q)
    flops = 4 * hq * d * length * (length + 1) / 2

    def prefill() -> None:
        extend_attention(q, kc, vc, bt, cu, sl, scale, max_q_len=length, out=out, backend="triton")

    us = timer.kernel_us(prefill)
    kd = kc.view(-1, hkv, d)[plan.page_size : plan.page_size + length]  # any dense K/V of the right shape
    qd, kd = q.transpose(0, 1).unsqueeze(0), kd.transpose(0, 1).unsqueeze(0)

    def sdpa() -> None:
        torch.nn.functional.scaled_dot_product_attention(qd, kd, kd, is_causal=True, enable_gqa=True)

    sdpa_us = timer.kernel_us(sdpa)
    res.add(section="prefill", model=name, q_len=length, kernel_us=us, tflops=flops / us / 1e6,
            sdpa_dense_us=sdpa_us)  # fmt: skip
    res.say(
        f"prefill {length} tokens ({name}): {us:.1f} us, {flops / us / 1e6:.0f} TFLOP/s "
        f"(dense torch SDPA, no paging: {sdpa_us:.1f} us)"
    )


# ----------------------------------------------------------------------------------------------- sweep


def sweep(plan: Plan, timer: Timer, res: Results) -> None:
    """Tile configs for decode and prefill, and split counts for decode, around the defaults."""
    from tokenrouter.engine.attention.triton_common import KernelConfig
    from tokenrouter.engine.attention.triton_decode import decode_attention_triton, decode_num_splits
    from tokenrouter.engine.attention.triton_extend import extend_attention_triton

    gen = torch.Generator(device=plan.device).manual_seed(4)
    name, (hq, hkv, d) = next(iter(plan.models.items()))
    scale = d**-0.5
    batch, ctx = plan.batches[min(2, len(plan.batches) - 1)], max(plan.contexts)
    width = ctx // plan.page_size
    kc, vc = make_cache(batch * width + 1, hkv, d, plan, gen)
    bt = block_tables_for([ctx] * batch, width, batch * width + 1, plan, gen)
    sl = ivec([ctx] * batch, plan)
    q = torch.randn(batch, hq, d, generator=gen, device=plan.device).to(plan.dtype)
    out = torch.empty_like(q)
    timed = []
    configs = [KernelConfig(block_n=n, num_warps=w, num_stages=s) for n, w, s in
               ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (64, 8, 2), (128, 8, 3))]  # fmt: skip
    for cfg in configs:
        us = timer.kernel_us(lambda cfg=cfg: decode_attention_triton(q, kc, vc, bt, sl, scale, out=out, config=cfg))
        res.add(section="sweep_decode", model=name, batch=batch, ctx=ctx, config=str(cfg), kernel_us=us)
        timed.append((us, cfg))
    us, cfg = min(timed, key=lambda t: t[0])
    res.say(f"sweep decode B={batch} ctx={ctx}: best {cfg} {us:.1f} us")

    # Split counts around the heuristic, for one row and for `batch` rows (sub-batches of the same table).
    for rows in sorted({1, batch}):
        auto = decode_num_splits(rows, hkv, width, plan.page_size, q.device)
        cells = []
        for splits in sorted({1, max(1, auto // 2), auto, auto * 2}):
            us = timer.kernel_us(
                lambda rows=rows, splits=splits: decode_attention_triton(
                    q[:rows], kc, vc, bt[:rows], sl[:rows], scale, out=out[:rows], num_splits=splits
                )
            )
            res.add(section="sweep_splits", model=name, batch=rows, ctx=ctx, splits=splits, kernel_us=us)
            cells.append(f"{splits}{'*' if splits == auto else ''}:{us:.1f}")
        res.say(f"sweep splits B={rows} ctx={ctx} (splits:us, *=auto): " + " ".join(cells))

    length = plan.prefill_len
    pages = -(-length // plan.page_size)
    kc, vc = make_cache(pages + 1, hkv, d, plan, gen)
    bt = block_tables_for([length], pages, pages + 1, plan, gen)
    cu, sl = cu_of([length], plan), ivec([length], plan)
    q = torch.randn(length, hq, d, generator=gen, device=plan.device).to(plan.dtype)
    out = torch.empty_like(q)
    timed = []
    configs = [KernelConfig(block_m=m, block_n=n, num_warps=w, num_stages=s) for m, n, w, s in
               ((64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 2), (64, 32, 4, 3), (128, 64, 8, 3))]  # fmt: skip
    for cfg in configs:
        us = timer.kernel_us(
            lambda cfg=cfg: extend_attention_triton(q, kc, vc, bt, cu, sl, scale, max_q_len=length, out=out, config=cfg)
        )
        res.add(section="sweep_prefill", model=name, q_len=length, config=str(cfg), kernel_us=us)
        timed.append((us, cfg))
    us, cfg = min(timed, key=lambda t: t[0])
    res.say(f"sweep prefill {length}: best {cfg} {us:.1f} us")


# ------------------------------------------------------------------------------------------------ main


def write_csv(path: str, rows: list[dict]) -> None:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for attention_bench.csv")
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile-config sweep")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (needs TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)

    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--smoke runs the Triton kernels in the CPU interpreter: set TRITON_INTERPRET=1")
        from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

        patch_interpreter_for_numpy24()
        plan = SMOKE_PLAN
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device (use --smoke with TRITON_INTERPRET=1 for a CPU plumbing check)")
        plan = GPU_PLAN
    os.makedirs(args.out, exist_ok=True)
    timer = Timer(cuda=plan.device == "cuda")
    res = Results()
    t0 = time.perf_counter()
    import triton

    dev = torch.cuda.get_device_name() if timer.cuda else "cpu (interpreter)"
    res.say(f"attention_bench: {dev}, torch {torch.__version__}, triton {triton.__version__}, {plan.dtype}")
    check_correctness(plan, timer, res)
    res.say(f"decode, page {plan.page_size}: per ctx {'/'.join(map(str, plan.contexts))}: "
            "graph_us eager_us GB/s(graph) splits  [ceiling 4255 GB/s]")  # fmt: skip
    bench_decode(plan, timer, res)
    res.say(f"extend (graph us) q_len {'/'.join(map(str, plan.extend_q))}: extend-kernel vs virtual-decode rows")
    bench_extend(plan, timer, res)
    if plan.sweep and not args.no_sweep:
        if time.perf_counter() - t0 < 100:
            sweep(plan, timer, res)
        else:
            res.say("sweep skipped: time budget")
    path = os.path.join(args.out, "attention_bench.csv")
    write_csv(path, res.rows)
    res.say(f"wrote {path} ({len(res.rows)} rows) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
