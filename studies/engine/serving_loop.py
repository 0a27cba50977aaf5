#!/usr/bin/env python
"""The engine driven as a subserver: the runtime's Scheduler -> Engine loop (`tokenrouter.runtime.engine_loop`, in
process: `runtime.local_loop.LocalLoop`; late prepare included on CUDA), overlap on and off, on a mixed workload
(prefill chunks, decodes, 2-4 token peer returns, some sampled rows), plus the issue's targets measured directly.

    python studies/engine/serving_loop.py --out OUT_DIR            # one H200: about 4-6 minutes
    python studies/engine/serving_loop.py --out OUT_DIR --smoke    # tiny model on CPU, seconds (a test)

Per model (Qwen3-0.6B, Qwen3-8B for the b=1 decode line only, Qwen3-32B; dummy weights): start-up time (load,
graph capture, warmup), the memory report, b=1 decode step (graph step with its wait / replay alone), a steady
b=8 decode loop with overlap (host overhead over replay; GPU idle gap between steps from per-step events), the
mixed workload with overlap on and off (tokens/s, idle gaps, steps whose decode rows ran in a graph, steps with
a varlen part that ran in a varlen graph), a 512-token prefill chunk + 8 decode rows step (varlen graph vs
eager), the graph counts and capture time, and the JIT compiles after warmup.
Host packing at batch 256, context 8k is timed on the host alone (the page tables
are incremental, so it must not grow with context). Writes OUT_DIR/summary.json and steps.csv; prints a short
summary last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import TINY, Harness

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.router import Router
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.engine import warmup as warm
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.page_table import PageTable
from tokenrouter.engine.runner import Engine
from tokenrouter.engine.step_plan import PlanContext, plan_step
from tokenrouter.runtime.local_loop import EchoPeer, LocalLoop, PositionHopRouter

# gemv_probe, 2026-11-30 (the "today"): steps launched back to back, compared with `pipelined_ms`
TODAY_B1_MS = {"qwen3-0.6b": 0.93, "qwen3-8b": 4.57}


class Study(Harness):
    def __init__(self, args: argparse.Namespace) -> None:
        self.start(args, torch.cuda.is_available() and not args.smoke, "serving_loop_")
        self.out: dict[str, Any] = {"errors": [], "models": {}, "skipped": []}
        self.steps: list[dict[str, Any]] = []
        self.smoke = args.smoke

    def left(self) -> float:
        return self.args.deadline - self.elapsed()

    def engine(self, model: str, **kw: Any) -> Engine:
        cfg: dict[str, Any] = {"model": model, "load_format": "dummy", "page_size": 16, "max_batch_size": 64,
                               "max_num_batched_tokens": 2048}  # fmt: skip
        if self.smoke:
            path = self.tmp / "tiny"
            if not path.exists():
                path.mkdir()
                (path / "config.json").write_text(json.dumps(TINY))
            cfg.update(model=str(path), device="cpu", dtype="float32", attention_backend="torch", ops_backend="torch",
                       graph_emulation=True, num_pages=400, graph_buckets=(1, 2, 4, 8, 16, 32, 64))  # fmt: skip
        else:
            cfg.update(gpu_memory_utilization=self.args.mem_frac)
        cfg.update(kw)
        return Engine(EngineConfig(**cfg))

    # ---- parts ----------------------------------------------------------------------------------------
    def decode_b1(self, eng: Engine, ctx: int) -> dict[str, float]:
        req = Request("b1", [1] * ctx, ctx)
        eng.kv_pool.grow(req.pages, ctx + 64)
        eng.step(Batch(0, 0, [BatchRow(req, 0, ctx)])).result()
        times = []
        for i in range(40 if self.cuda else 3):
            b = Batch(0, 1 + i, [BatchRow(req, ctx - 1, 1)])
            t = time.perf_counter()
            eng.step(b).result()
            times.append(time.perf_counter() - t)
        out = {"step_ms": 1e3 * statistics.median(times)}
        # As the "today" was measured (gemv_probe): steps launched back to back, one wait at the end, best
        # of two rounds; host work hides behind the GPU as in a serving loop with overlap.
        bat = Batch(0, 10_000, [BatchRow(req, ctx - 1, 1)])
        n = 60 if self.cuda else 2
        rounds = []
        for _ in range(2):
            eng.step(bat).result()
            t = time.perf_counter()
            hs = [eng.step(bat) for _ in range(n)]
            hs[-1].result()
            rounds.append(1e3 * (time.perf_counter() - t) / n)
        out["pipelined_ms"] = min(rounds)
        bucket = eng.graph_bucket_for(Batch(0, 0, [BatchRow(req, ctx - 1, 1)]))
        if self.cuda and bucket in (eng.graphs.graphs if eng.graphs else {}):
            out["replay_ms"] = self.replay_ms(eng, bucket)
        eng.kv_pool.release(req.pages)
        return out

    def prefill_chunk(self, eng: Engine, ctx: int, chunk: int = 512, decodes: int = 8) -> dict[str, Any]:
        """One step of a `chunk`-token prefill chunk plus `decodes` decode rows (context `ctx`), repeated: wall
        time per step (launch + wait) and GPU time, in the varlen graph and with graphs off (eager pass)."""
        if self.smoke:
            chunk, decodes, ctx = 40, 4, 16
        reqs = [Request(f"pc{i}", [1] * ctx, ctx) for i in range(decodes)]
        new = Request("pc-new", [2] * chunk, chunk)
        for r in reqs:
            eng.kv_pool.grow(r.pages, ctx + 1)
        eng.kv_pool.grow(new.pages, chunk)
        step = 10_000
        eng.step(Batch(0, step, [BatchRow(r, 0, ctx) for r in reqs])).result()
        rows = [BatchRow(new, 0, chunk, sample=False)] + [BatchRow(r, ctx - 1, 1) for r in reqs]
        out: dict[str, Any] = {}
        for mode, on in (("graph", True), ("eager", False)):
            eng.use_graphs = on
            eng.timing = self.cuda
            wall, gpu, bucket = [], [], None
            for _ in range(12 if self.cuda else 2):
                step += 1
                t = time.perf_counter()
                h = eng.step(Batch(0, step, rows))
                h.result()
                wall.append(time.perf_counter() - t)
                bucket = h.varlen_bucket
                if h.gpu_start is not None:
                    gpu.append(h.gpu_start.elapsed_time(h.gpu_end))
            out[mode] = {"step_ms": 1e3 * statistics.median(wall[2:] or wall),
                         "gpu_ms": statistics.median(gpu[2:]) if gpu else None, "varlen_bucket": bucket}  # fmt: skip
        eng.use_graphs, eng.timing = True, False
        for r in [*reqs, new]:
            eng.kv_pool.release(r.pages)
        return out

    def replay_ms(self, eng: Engine, bucket: int, reps: int = 30) -> float:
        g = eng.graphs.graphs[bucket]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(eng.stream):
            g.replay()
            s.record()
            for _ in range(reps):
                g.replay()
            e.record()
        e.synchronize()
        return s.elapsed_time(e) / reps

    def run_loop(self, eng: Engine, label: str, reqs: list[Request], *, overlap: bool, hops: bool) -> dict[str, Any]:
        router = PositionHopRouter(period=6) if hops else Router()
        sched = Scheduler(0, 2, kv=eng.kv_pool, router=router, max_batch_size=eng.max_batch_size,
                          max_batch_tokens=self.args.batch_tokens, overlap=overlap)  # fmt: skip
        for r in reqs:
            sched.add(r)
        eng.timing = self.cuda
        loop = LocalLoop(eng, sched, keep_handles=True, peer=EchoPeer(eng.spec.vocab_size, delay=2) if hops else None)
        loop.run(max_steps=self.args.max_steps)
        st = loop.times
        eng.timing = False
        hs = loop.handles
        gaps, busy = [], []
        if self.cuda:
            for a, b in itertools.pairwise(hs):
                if a.gpu_end is not None and b.gpu_start is not None:
                    gaps.append(a.gpu_end.elapsed_time(b.gpu_start))
            busy = [h.gpu_start.elapsed_time(h.gpu_end) for h in hs if h.gpu_start is not None]
        with_decode = graph_ok = with_varlen = varlen_ok = 0
        for h in hs:
            dec = [i for i, r in enumerate(h.batch.rows) if r.num_tokens == 1 and i not in h.skipped_rows]
            if dec:  # decode rows in a graph: the decode graph, or the varlen graph that ran the whole step
                with_decode += 1
                graph_ok += set(dec) <= set(h.graph_rows) or h.varlen_bucket is not None
            if h.eager_tokens:  # a varlen part (prefill chunks, long returns; the whole step unless split)
                with_varlen += 1
                varlen_ok += h.varlen_bucket is not None
            self.steps.append({"run": label, "rows": len(h.batch.rows), "tokens": h.num_tokens,
                               "graph_bucket": h.graph_bucket, "eager_tokens": h.eager_tokens,
                               "varlen_bucket": h.varlen_bucket,
                               "prepare_ms": 1e3 * h.prepare_s, "launch_ms": 1e3 * h.launch_s})  # fmt: skip
        toks = sum(len(r.token_ids) - r.prompt_len for r in reqs)
        n = max(loop.launched, 1)
        rec = {"run": label, "steps": loop.launched, "wall_s": st.wall_s, "out_tok_per_s": toks / max(st.wall_s, 1e-9),
               "host_step_ms": 1e3 * st.step_s / n, "complete_ms": 1e3 * st.complete_s / n,
               "wait_ms": 1e3 * st.wait_s / n, "steps_with_decode": with_decode,
               "graph_fraction": graph_ok / max(with_decode, 1), "steps_with_varlen": with_varlen,
               "varlen_graph_fraction": varlen_ok / with_varlen if with_varlen else None,
               "gpu_idle_gap_ms": statistics.median(gaps) if gaps else None,
               "gpu_busy_ms": statistics.median(busy) if busy else None, "finished": len(loop.finished)}  # fmt: skip
        self.log(f"  {label}: {loop.launched} steps {rec['out_tok_per_s']:.0f} tok/s"
                 f" graph_frac {rec['graph_fraction']:.3f}"
                 f" idle gap {rec['gpu_idle_gap_ms']} ms host step {rec['host_step_ms']:.3f} ms")  # fmt: skip
        return rec

    def steady_b8(self, eng: Engine, name: str, ctx: int) -> dict[str, Any]:
        """Steady decode at batch 8 with overlap: the prompts are prefilled first (untimed: prefill chunks run in
        the eager pass), then a timed window of decode-only steps, then the bucket-8 graph replayed alone right
        after its last real step (its static inputs are then a valid step). host_overhead_frac = (wall time per
        step - replay time) / replay time."""
        reqs = self.steady_requests(eng.spec.vocab_size, 8, ctx, 6 if self.smoke else 200)
        sched = Scheduler(0, 2, kv=eng.kv_pool, router=Router(), max_batch_size=eng.max_batch_size,
                          max_batch_tokens=self.args.batch_tokens, overlap=True)  # fmt: skip
        for r in reqs:
            sched.add(r)
        warm_steps = -(-8 * ctx // self.args.batch_tokens) + 3
        LocalLoop(eng, sched).run(max_steps=warm_steps)
        assert all(r.num_computed >= r.prompt_len for r in reqs), "steady_b8: prompts not prefilled"
        eng.timing = self.cuda
        loop = LocalLoop(eng, sched, keep_handles=True)
        loop.run(max_steps=3 if self.smoke else 60)
        st = loop.times
        eng.timing = False
        rows = {len(h.batch.rows) for h in loop.handles}
        eager = sum(h.eager_tokens for h in loop.handles)
        n = max(loop.launched, 1)
        rec: dict[str, Any] = {"run": f"{name}/steady_b8/overlap", "steps": loop.launched, "rows": sorted(rows),
                               "eager_tokens": eager, "wall_step_ms": 1e3 * st.wall_s / n,
                               "host_step_ms": 1e3 * st.step_s / n, "schedule_ms": 1e3 * st.schedule_s / n,
                               "complete_ms": 1e3 * st.complete_s / n, "wait_ms": 1e3 * st.wait_s / n,
                               "out_tok_per_s": 8 * loop.launched / max(st.wall_s, 1e-9)}  # fmt: skip
        if self.cuda:
            gaps = [a.gpu_end.elapsed_time(b.gpu_start) for a, b in itertools.pairwise(loop.handles)
                    if a.gpu_end is not None and b.gpu_start is not None]  # fmt: skip
            rec["gpu_idle_gap_ms"] = statistics.median(gaps) if gaps else None
            if loop.handles and loop.handles[-1].graph_bucket == eng.graph_rule.bucket_for(8):
                rep = self.replay_ms(eng, loop.handles[-1].graph_bucket)
                rec.update(replay_ms=rep, host_overhead_frac=max(0.0, rec["wall_step_ms"] - rep) / rep)
        for r in reqs:
            for act in sched.abort(r.rid):
                del act
        self.log(f"  {rec['run']}: {loop.launched} steps rows {sorted(rows)} wall/step {rec['wall_step_ms']:.3f} ms "
                 f"(host step {rec['host_step_ms']:.3f}, schedule {rec['schedule_ms']:.3f}, complete "
                 f"{rec['complete_ms']:.3f}, wait {rec['wait_ms']:.3f}) replay {rec.get('replay_ms')} "
                 f"overhead {rec.get('host_overhead_frac')} idle gap {rec.get('gpu_idle_gap_ms')}")  # fmt: skip
        return rec

    def mixed_requests(self, vocab: int, n: int, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        out = []
        for i in range(n):
            plen = int(rng.choice([3, 8, 20, 40, 70] if self.smoke else [8, 40, 200, 700, 1500]))
            sp = SamplingParams(
                max_tokens=int(rng.integers(4, 10) if self.smoke else rng.integers(16, 48)), ignore_eos=True
            )
            if i % 3 == 1:
                sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=i, max_tokens=sp.max_tokens)
            out.append(Request(f"m{i}", rng.integers(0, vocab, plen).tolist(), plen, sampling=sp))
        return out

    def steady_requests(self, vocab: int, n: int, ctx: int, out_len: int) -> list[Request]:
        rng = np.random.default_rng(1)
        return [Request(f"s{i}", rng.integers(0, vocab, ctx).tolist(), ctx,
                        sampling=SamplingParams(max_tokens=out_len, ignore_eos=True)) for i in range(n)]  # fmt: skip

    def model(self, name: str, full: bool) -> None:
        rec: dict[str, Any] = {}
        self.out["models"][name] = rec
        eng = self.engine(name)
        rec.update(startup_s=eng.startup_s, warmup_s=eng.warmup_s, memory=eng.memory_report().as_dict(),
                   capture=dict(eng.capture_stats),
                   jit_after_warmup=eng.jit_cache_after_warmup, pdl_error=eng.pdl_error)  # fmt: skip
        self.log(f"{name}: startup {eng.startup_s:.1f}s (warmup {eng.warmup_s:.1f}s) {eng.memory_report().summary()}")
        ctx = 64 if self.smoke else 1024
        rec["decode_b1"] = self.decode_b1(eng, ctx)
        self.log(f"  b=1 decode ctx {ctx}: {rec['decode_b1']}")
        if full:
            rec["prefill_chunk"] = self.prefill_chunk(eng, ctx)
            self.log(f"  512-token chunk + 8 decode rows: {rec['prefill_chunk']}")
            vocab = eng.spec.vocab_size
            rec["steady_b8"] = self.steady_b8(eng, name, ctx)
            for overlap in (True, False):
                if self.left() < 60 and not self.smoke:
                    self.out["skipped"].append(f"{name} mixed overlap={overlap}")
                    continue
                reqs = self.mixed_requests(vocab, 6 if self.smoke else 48, 2)
                key = "mixed_overlap" if overlap else "mixed_sync"
                rec[key] = self.run_loop(eng, f"{name}/{key}", reqs, overlap=overlap, hops=True)
        rec["jit_compiles_after_warmup"] = warm.jit_cache_entries() - eng.jit_cache_after_warmup
        eng.close()
        self.free()
        rec["allocated_after_close"] = torch.cuda.memory_allocated() if self.cuda else 0

    def prepare_b256(self, ctx: int) -> dict[str, float]:
        """Host plan time of a 256-row decode batch at `ctx` (no device work: the table is on the CPU)."""
        ps, rows = 16, 256
        per = -(-(ctx + 64) // ps)
        pool = KVPool(rows * per + 2, ps)
        reqs = [Request(f"p{i}", [1] * ctx, ctx) for i in range(rows)]
        for r in reqs:
            pool.grow(r.pages, ctx + 64)
        table = PageTable(4 * rows + 1, per, pool.num_pages, torch.device("cpu"))
        ctxp = PlanContext(ps, ctx + 64, 151936, EngineConfig("qwen3-0.6b").graph_rule(), table,
                           np.full(table.num_slots, -1, np.int64), 256, __import__("random").Random(0))  # fmt: skip
        buf = np.empty(1 << 22, np.int32)
        times, cpu = [], []
        for step in range(30):
            rows_ = [BatchRow(r, ctx - 1 + step, 1) for r in reqs]
            t, c = time.perf_counter(), time.thread_time()
            plan = plan_step(Batch(0, step, rows_), ctxp, lambda g, e: buf)
            table.commit(plan.table)
            times.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            for r in reqs:
                r.token_ids.append(1)
        # cpu_ms: this thread's CPU time (a loaded shared machine inflates the wall time, not this)
        return {"cold_ms": 1e3 * times[0], "median_ms": 1e3 * statistics.median(times[1:]),
                "cpu_ms": 1e3 * statistics.median(cpu[1:])}  # fmt: skip

    def run(self) -> None:
        a = self.args
        prep = self.guarded("prepare", self.prepare_b256, 8192)
        prep1k = self.guarded("prepare1k", self.prepare_b256, 1024)
        self.out["prepare_b256"] = {"ctx8k": prep, "ctx1k": prep1k}
        self.log(f"prepare b=256: ctx 8k {prep}, ctx 1k {prep1k}")
        models = ["tiny"] if self.smoke else a.models.split(",")
        for name in models:
            if self.left() < 45 and not self.smoke:
                self.out["skipped"].append(name)
                continue
            full = name != "qwen3-8b"
            self.guarded(name, self.model, name if not self.smoke else "qwen3-0.6b", full)
        self.summarize()

    def summarize(self) -> None:
        m = self.out["models"]
        first = next(iter(m.values()), {})
        mixed = ("mixed_overlap", "mixed_sync")
        fracs = [r[k]["graph_fraction"] for r in m.values() for k in mixed if k in r]
        vfracs = [r[k]["varlen_graph_fraction"] for r in m.values() for k in mixed
                  if k in r and r[k]["varlen_graph_fraction"] is not None]  # fmt: skip
        s: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "host_overhead_frac_overlap": first.get("steady_b8", {}).get("host_overhead_frac"),
            "graph_fraction_mixed": min(fracs, default=None),
            "varlen_graph_fraction_mixed": min(vfracs, default=None),
            "prefill_chunk_step_ms": {k: r.get("prefill_chunk") for k, r in m.items() if "prefill_chunk" in r},
            "capture": {k: r.get("capture") for k, r in m.items()},
            "prepare_ms_b256_ctx8k": (self.out["prepare_b256"]["ctx8k"] or {}).get("median_ms"),
            "prepare_ms_b256_ctx1k": (self.out["prepare_b256"]["ctx1k"] or {}).get("median_ms"),
            "prepare_cpu_ms_b256": {k: (v or {}).get("cpu_ms") for k, v in self.out["prepare_b256"].items()},
            "jit_compiles_after_warmup": sum(r.get("jit_compiles_after_warmup", 0) for r in m.values()),
            "startup_s": {k: r.get("startup_s") for k, r in m.items()},
            "decode_b1_ms": {k: r.get("decode_b1") for k, r in m.items()},
            "memory": {k: r.get("memory") for k, r in m.items()},
            "idle_gap_ms": {
                k: {x: r[x].get("gpu_idle_gap_ms") for x in (*mixed, "steady_b8") if x in r} for k, r in m.items()
            },
            "tok_per_s": {k: {x: r[x].get("out_tok_per_s") for x in mixed if x in r} for k, r in m.items()},
            "errors": self.out["errors"],
            "skipped": self.out["skipped"],
        }
        self.out["summary"] = s
        self.write_outputs("serving_loop.json", {"steps.csv": self.steps})
        out = Path(self.args.out)
        (out / "summary.json").write_text(json.dumps(s, indent=1, default=str))
        print("SUMMARY serving_loop", s["device"], f"{self.elapsed():.0f}s")
        keys = (
            "host_overhead_frac_overlap",
            "graph_fraction_mixed",
            "varlen_graph_fraction_mixed",
            "prefill_chunk_step_ms",
            "capture",
            "prepare_ms_b256_ctx8k",
            "prepare_ms_b256_ctx1k",
            "prepare_cpu_ms_b256",
            "jit_compiles_after_warmup",
            "startup_s",
            "decode_b1_ms",
            "idle_gap_ms",
            "tok_per_s",
        )
        for k in keys:
            print(f"  {k}: {s[k]}")
        for k, r in m.items():
            print(
                f"  memory {k}: {r.get('memory', {}) and Engine.__name__} "
                f"{_mem_line(r.get('memory'))} after close {r.get('allocated_after_close')}"
            )
        for k, ms in TODAY_B1_MS.items():
            got = (s["decode_b1_ms"].get(k) or {}).get("pipelined_ms")
            if got is not None:
                print(f"  b=1 decode {k}: {got:.3f} ms vs today {ms} ms -> {'OK' if got <= ms * 1.02 else 'SLOWER'}")
        print(f"  errors: {s['errors']} skipped: {s['skipped']}")


def _mem_line(mem: dict | None) -> str:
    if not mem:
        return "-"
    g = lambda x: "-" if x is None else f"{x / (1 << 30):.2f}G"  # noqa: E731
    return (f"weights {g(mem['weights'])} kv {g(mem['kv_cache'])} pages {mem['num_pages']} graph_pool "
            f"{g(mem['graph_pool'])} act {g(mem['activation_peak'])} budget {g(mem['budget'])}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU")
    p.add_argument("--models", default="qwen3-0.6b,qwen3-8b,qwen3-32b")
    p.add_argument("--mem-frac", type=float, default=0.85, help="gpu_memory_utilization of each engine (one at a time)")
    p.add_argument("--batch-tokens", type=int, default=512, help="scheduler token budget (prefill chunk size)")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--deadline", type=float, default=420.0, help="seconds; later parts are skipped and listed")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_tokens, args.max_steps = 24, 300
    Study(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
