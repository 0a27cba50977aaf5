#!/usr/bin/env python
"""Engine check and benchmark on one GPU: bf16 correctness against fp32 references, then decode/extend step
timing for Qwen3-0.6B/8B/32B shapes with dummy weights, next to the measured device copy bandwidth.

    python studies/engine/engine_bench.py --out OUT_DIR          # GPU, about 5-8 minutes
    python studies/engine/engine_bench.py --out OUT_DIR --smoke  # tiny config, CPU is fine, seconds

Writes OUT_DIR/engine_bench.json (everything), timing.csv and correctness.csv, and prints a summary table
last. Every section is guarded: a failing config is recorded (errors in the JSON and the summary) and the
run continues. Bytes per step = weights streamed (all but an untied embedding table) + KV of every row's
context read once; GB/s = bytes / step time; "%copy" compares with a device-to-device copy (read + write).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling graph_timing module
import graph_timing as gt

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.runner import Engine
from tokenrouter.models.spec import load_spec

TINY = {
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024, "rope_theta": 1e6, "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip
# The reference path: fp32, pure-torch attention and elementwise ops, eager.
FP32_REF = {"dtype": "float32", "attention_backend": "torch", "ops_backend": "torch", "cuda_graphs": False,
            "graph_emulation": False}  # fmt: skip


class Harness:
    """What every study script here shares: elapsed time, logging, recorded errors, device sync and freeing.
    Subclasses set `t0`, `cuda` and `out` (a dict with an "errors" list)."""

    t0: float
    cuda: bool
    out: dict[str, Any]

    def start(self, args: argparse.Namespace, cuda: bool, prefix: str) -> None:
        """Common state: the arguments, the device, the clock, and a scratch directory."""
        self.args = args
        self.cuda = cuda
        self.device = torch.device("cuda" if cuda else "cpu")
        self.t0 = time.perf_counter()
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def error(self, where: str, e: BaseException) -> None:
        line = f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print("ERROR", line, flush=True)
        traceback.print_exc(limit=5)
        self.out["errors"].append(line)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def engine(self, model: str, **kw: Any) -> Engine:
        """An engine of `model` on this device (dummy weights unless `kw` says otherwise; on CPU the fp32 torch
        path with emulated graphs); `kw` overrides any `EngineConfig` field."""
        cfg: dict[str, Any] = {"model": model, "device": str(self.device), "page_size": 16, "seed": 0}
        if not self.cuda:
            cfg.update(dtype="float32", attention_backend="torch", ops_backend="torch", graph_emulation=True)
        cfg.update(kw)
        return Engine(EngineConfig(**cfg))

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def write_outputs(self, json_name: str, tables: dict[str, list[dict[str, Any]]]) -> None:
        """`self.out` as JSON plus one CSV per non-empty table (columns: the union of the rows' scalar keys)."""
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        self.out["elapsed_s"] = self.elapsed()
        (out / json_name).write_text(json.dumps(self.out, indent=1, default=str))
        for fname, rows in tables.items():
            if rows:
                cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], list)))
                with open(out / fname, "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
                    w.writeheader()
                    w.writerows(rows)

    def guarded(self, where: str, fn, *a, **kw):
        """fn(*a, **kw), or None with the error recorded; device memory freed either way."""
        try:
            return fn(*a, **kw)
        except Exception as e:
            self.error(where, e)
            return None
        finally:
            self.free()


class Bench(Harness):
    def __init__(self, args: argparse.Namespace) -> None:
        self.start(args, torch.cuda.is_available() and not args.cpu, "engine_bench_")
        self.out: dict[str, Any] = {"env": env_info(self.device), "errors": [], "correctness": [], "timing": []}

    # ---- copy bandwidth ----------------------------------------------------------------------------------
    def copy_bandwidth(self) -> None:
        nbytes = (1 << 30) if self.cuda else (64 << 20)
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.device).fill_(1)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        reps = 40 if self.cuda else 5
        self.sync()
        t = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        self.sync()
        dt = (time.perf_counter() - t) / reps
        self.copy_gbps = 2 * nbytes / dt / 1e9
        self.out["copy_gbps"] = self.copy_gbps
        del src, dst
        self.launch_us = self.graph_launch_us() if self.cuda else 0.0
        self.out["graph_launch_us"] = self.launch_us
        print(f"device copy bandwidth: {self.copy_gbps:.0f} GB/s (read+write); graph launch {self.launch_us:.1f} us")
        self.free()

    def graph_launch_us(self) -> float:
        """us per replay of a one-kernel graph replayed back to back: the cost of launching a graph."""
        x = torch.zeros(1, device=self.device)
        return gt.capture_and_time(lambda: x.add_(1), n=200, warmup_calls=1, warmup_replays=10,
                                   back_to_back=True).median_us  # fmt: skip

    # ---- correctness ---------------------------------------------------------------------------------------
    def correctness(self) -> None:
        try:
            self.check_tiny_hf()
        except Exception as e:
            self.error("correctness tiny-vs-HF", e)
        self.free()
        shapes = [("qwen3-0.6b", 28), ("qwen3-8b", 4)] if self.cuda else [("tiny", 2)]
        for name, layers in shapes:
            try:
                self.check_real_shapes(name, layers)
            except Exception as e:
                self.error(f"correctness {name}", e)
            self.free()

    def tiny_dir(self, hf: bool) -> Path:
        path = self.tmp / ("tiny_hf" if hf else "tiny_cfg")
        if path.exists():
            return path
        path.mkdir()
        if hf:
            from transformers import Qwen3Config, Qwen3ForCausalLM

            cfg = {k: v for k, v in TINY.items() if k != "architectures"}
            torch.manual_seed(0)
            model = Qwen3ForCausalLM(Qwen3Config(**cfg)).float()
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "norm" in n:
                        p.copy_(1 + 0.2 * torch.randn_like(p))
                    else:
                        p.normal_(0, 1.5 * p.shape[-1] ** -0.5)
            model.save_pretrained(path)
            self.hf_tiny = model.eval()
        else:
            (path / "config.json").write_text(json.dumps(TINY))
        return path

    def check_tiny_hf(self) -> None:
        """Tiny random HF Qwen3 checkpoint: our bf16 engine (graphs, Triton) and fp32 engine vs HF fp32."""
        try:
            path = self.tiny_dir(hf=True)
        except ImportError as e:
            self.error("transformers unavailable, HF check skipped", e)
            return
        test = self.engine(str(path), num_pages=512, max_context_len=1024, graph_buckets=(1, 2, 4, 8, 16, 32))
        ref = self.engine(str(path), num_pages=512, max_context_len=1024, **FP32_REF)
        recs = drive([test, ref], seed=1)
        hf = self.hf_tiny.to(self.device)
        logits = {}
        with torch.no_grad():
            for rid, ids in recs["seqs"].items():
                logits[rid] = hf(torch.tensor([ids], device=self.device)).logits[0].float().cpu()
        labels = (f"ours {describe(test)} vs HF fp32", f"ours {describe(ref)} vs HF fp32")
        for label, idx in zip(labels, (0, 1), strict=True):
            errs, agree, n = [], 0, 0
            for rid, pos, lg in recs["logits"][idx]:
                r = logits[rid][pos]
                errs.append(float((lg.float() - r).abs().max() / r.abs().max()))
                agree += int(lg.argmax()) == int(r.argmax())
                n += 1
            self.record_corr("tiny-hf", label, max(errs), agree / n, n)
        test.close()
        ref.close()

    def check_real_shapes(self, name: str, layers: int) -> None:
        """Dummy weights at real widths (layer count trimmed): bf16 graphs+Triton vs fp32 torch on the same device."""
        if name == "tiny":
            model = str(self.tiny_dir(hf=False))
        else:
            cfg = dict(load_spec(name).raw or {})
            cfg["num_hidden_layers"] = layers
            d = self.tmp / f"{name}-{layers}l"
            d.mkdir(exist_ok=True)
            (d / "config.json").write_text(json.dumps(cfg))
            model = str(d)
        kw = {"load_format": "dummy", "num_pages": 1024, "max_context_len": 4096}
        test = self.engine(model, graph_buckets=(1, 2, 4, 8, 16, 32), **kw)
        ref = self.engine(model, **FP32_REF, **kw)
        with torch.no_grad():
            for p_ref, p in zip(ref.model.parameters(), test.model.parameters(), strict=True):
                p_ref.copy_(p)
        recs = drive([test, ref], seed=2, long_prompts=self.cuda)
        errs = [float((a.float() - b.float()).abs().max() / b.float().abs().max())
                for (_, _, a), (_, _, b) in zip(recs["logits"][0], recs["logits"][1], strict=True)]  # fmt: skip
        agree = [int(a.argmax()) == int(b.argmax()) for (_, _, a), (_, _, b) in zip(*recs["logits"], strict=True)]
        label = f"{name} x{layers} layers: ours {describe(test)} vs ours {describe(ref)}"
        self.record_corr(name, label, max(errs), sum(agree) / len(agree), len(agree))
        if test.graph_error:
            self.out["errors"].append(f"{name}: graph capture failed: {test.graph_error}")
        test.close()
        ref.close()

    def record_corr(self, case: str, label: str, rel: float, agree: float, n: int) -> None:
        row = {"case": case, "check": label, "max_rel_err": rel, "greedy_agree": agree, "rows": n}
        self.out["correctness"].append(row)
        print(f"correctness {label}: max rel err {rel:.2e}, greedy agreement {agree:.1%} over {n} rows", flush=True)

    # ---- timing -----------------------------------------------------------------------------------------------
    def timing(self) -> None:
        a = self.args
        models = ["tiny"] if a.smoke else a.models.split(",")
        for name in models:
            if self.elapsed() > a.time_budget:
                self.out["errors"].append(f"{name}: skipped, time budget {a.time_budget}s spent")
                continue
            try:
                self.time_model(name)
            except Exception as e:
                self.error(f"timing {name}", e)
            self.free()

    def time_model(self, name: str) -> None:
        a = self.args
        batches = [int(x) for x in a.batches.split(",")]
        contexts = [int(x) for x in a.contexts.split(",")]
        model = str(self.tiny_dir(hf=False)) if name == "tiny" else name
        spec = load_spec(model)
        max_ctx = max(contexts) + 64
        pages_needed = max(batches) * math.ceil(max_ctx / 16) + 8
        kw: dict[str, Any] = {"load_format": "dummy", "max_context_len": max_ctx}
        buckets = sorted({b for b in batches} | {b * n for b in a.extend_batches for n in a.extend_tokens})
        kw["graph_buckets"] = tuple(buckets)
        if self.cuda:
            free, _ = torch.cuda.mem_get_info()
            kv_page = 2 * spec.num_layers * 16 * spec.num_kv_heads * spec.head_dim * 2
            fit = (free - spec.weight_bytes - (8 << 30)) // kv_page
            kw["num_pages"] = int(max(64, min(pages_needed, fit)))
        else:
            kw["num_pages"] = pages_needed
        t = time.perf_counter()
        eng = self.try_engines(name, model, kw)
        if eng is None:
            return
        print(
            f"[{name}] engine ready in {time.perf_counter() - t:.1f}s: {eng.num_pages} pages, graphs="
            f"{eng.graphs_enabled} ({eng.graph_error or 'ok'}), ops={eng.config.ops_backend}",
            flush=True,
        )
        weight_bytes = spec.decode_weight_bytes
        kvb = spec.kv_bytes_per_token
        for ctx in contexts:
            for b in batches:
                self.measure(eng, name, "decode", b, 1, ctx, weight_bytes, kvb)
        for n in a.extend_tokens:
            for b in a.extend_batches:
                self.measure(eng, name, "extend", b, n, min(contexts), weight_bytes, kvb)
        if not a.smoke:
            self.measure(eng, name, "prefill", 1, 2048, 2048, weight_bytes, kvb)
        eng.close()

    def try_engines(self, name: str, model: str, kw: dict[str, Any]) -> Engine | None:
        """Default config first; if it cannot build or run a step, fall back to torch ops, then to no graphs."""
        fallbacks = [{}, {"ops_backend": "torch"}, {"ops_backend": "torch", "cuda_graphs": False}]
        for extra in fallbacks:
            eng = None
            try:
                eng = self.engine(model, **kw, **extra)
                reqs = make_requests(eng, 1, 64)
                eng.step(Batch(0, 0, [BatchRow(reqs[0], 0, 64)]))
                eng.step(Batch(0, 0, [BatchRow(reqs[0], 63, 1)]))
                self.sync()
                release(eng, reqs)
                if extra:
                    self.out["errors"].append(f"{name}: running with fallback {extra}")
                return eng
            except Exception as e:
                self.error(f"{name} engine {extra or 'default'}", e)
                if eng is not None:
                    eng.close()
                del eng
                self.free()
        return None

    def measure(
        self, eng: Engine, name: str, kind: str, batch: int, n_tok: int, ctx: int, wbytes: int, kvb: int
    ) -> None:
        if self.elapsed() > self.args.time_budget:
            return
        need = batch * math.ceil(ctx / eng.page_size)
        if need > eng.kv_pool.num_free:
            self.out["errors"].append(f"{name} {kind} b={batch} ctx={ctx}: skipped, KV pool too small")
            return
        reqs = make_requests(eng, batch, ctx)
        rows = [BatchRow(r, ctx - n_tok, n_tok) for r in reqs]
        bat = Batch(0, 0, rows)
        modes = [True, False] if kind != "prefill" else [False]
        res: dict[str, Any] = {"model": name, "kind": kind, "batch": batch, "tokens_per_row": n_tok, "context": ctx}
        try:
            for graphs in modes:
                eng.use_graphs = graphs
                key = "graph" if graphs else "eager"
                if graphs and eng.graph_bucket_for(bat) is None:
                    continue
                ms = self.time_step(eng, bat, kind)
                res[f"{key}_ms"] = ms
                if graphs:
                    res["replay_ms"] = self.time_replay(eng, bat)
        except Exception as e:
            self.error(f"{name} {kind} b={batch} n={n_tok} ctx={ctx}", e)
        finally:
            eng.use_graphs = True
            release(eng, reqs)
        best = min((res[k] for k in ("graph_ms", "eager_ms") if k in res), default=None)
        if best is None:
            return
        step_bytes = wbytes + batch * ctx * kvb
        res["bytes"] = step_bytes
        res["tok_per_s"] = batch * n_tok / (best / 1e3)
        res["gbps"] = step_bytes / (best / 1e3) / 1e9
        res["pct_copy"] = 100 * res["gbps"] / self.copy_gbps
        res["floor_ms"] = step_bytes / (self.copy_gbps * 1e9) * 1e3
        self.out["timing"].append(res)
        g, e_ = res.get("graph_ms"), res.get("eager_ms")
        print(f"[{name}] {kind:7s} b={batch:3d} n={n_tok:4d} ctx={ctx:5d}: graph {fmt(g)} ms (replay "
              f"{fmt(res.get('replay_ms'))}), eager {fmt(e_)} ms, {res['gbps']:.0f} GB/s = {res['pct_copy']:.0f}% copy",
              flush=True)  # fmt: skip

    def time_step(self, eng: Engine, bat: Batch, kind: str) -> float:
        warm, target = (2, 0.3) if kind != "prefill" else (1, 0.5)
        for _ in range(warm):
            eng.step(bat)
        self.sync()
        t = time.perf_counter()
        eng.step(bat)
        self.sync()
        one = time.perf_counter() - t
        n = max(3, min(self.args.max_steps, int(target / max(one, 1e-5))))
        t = time.perf_counter()
        for _ in range(n):
            eng.step(bat)
        self.sync()
        return (time.perf_counter() - t) / n * 1e3

    def time_replay(self, eng: Engine, bat: Batch) -> float | None:
        """Device time of the captured graph alone (no host preparation), for the same inputs."""
        bucket = eng.graph_bucket_for(bat)
        if not self.cuda or bucket is None or bucket not in eng.graphs.graphs:
            return None
        eng.step(bat)  # leaves this batch's inputs in the static buffers
        with torch.cuda.stream(eng.stream):
            eng.graphs.run(bucket)
            eng.stream.synchronize()
            n = 20
            t = time.perf_counter()
            for _ in range(n):
                eng.graphs.run(bucket)
            eng.stream.synchronize()
        return (time.perf_counter() - t) / n * 1e3

    # ---- output ---------------------------------------------------------------------------------------------------
    def write(self) -> None:
        self.write_outputs(
            "engine_bench.json", {"timing.csv": self.out["timing"], "correctness.csv": self.out["correctness"]}
        )

    def summary(self) -> None:
        """At most ~45 lines: decode step times pivoted by batch size, extends and prefill condensed."""
        o = self.out
        env = o["env"]
        lines = ["", "=" * 110]
        lines.append(
            f"SUMMARY {env['device']} torch {env['torch']} triton {env['triton']} | copy {o.get('copy_gbps', 0):.0f}"
            f" GB/s, graph launch {o.get('graph_launch_us', 0):.1f} us | {self.elapsed():.0f} s"
        )
        for c in o["correctness"]:
            lines.append(f"  corr {c['check'][:80]:80s} rel {c['max_rel_err']:.1e} agree {c['greedy_agree']:.0%}")
        timing = o["timing"]
        batches = [int(x) for x in self.args.batches.split(",")]
        lines.append("  decode step ms per batch size: graph step / graph replay only (device) / eager; GB/s (%copy)")
        for model in dict.fromkeys(r["model"] for r in timing):
            rows = [r for r in timing if r["model"] == model]
            pre = [r for r in rows if r["kind"] == "prefill"]
            head = f"  {model}"
            if pre:
                head += f"  (prefill 2048 tok: {pre[0]['eager_ms']:.1f} ms, {pre[0]['tok_per_s']:.0f} tok/s)"
            lines.append(head)
            lines.append("    " + " " * 9 + "".join(f"{'b=' + str(b):>24s}" for b in batches))
            for ctx in dict.fromkeys(r["context"] for r in rows if r["kind"] == "decode"):
                by_b = {r["batch"]: r for r in rows if r["kind"] == "decode" and r["context"] == ctx}
                cells_t, cells_b = [], []
                for b in batches:
                    r = by_b.get(b)
                    if r is None:
                        cells_t.append(f"{'-':>24s}")
                        cells_b.append(f"{'-':>24s}")
                        continue
                    t = f"{fmt(r.get('graph_ms'))}/{fmt(r.get('replay_ms'))}/{fmt(r.get('eager_ms'))}"
                    cells_t.append(f"{t:>24s}")
                    cells_b.append(f"{r['gbps']:.0f} ({r['pct_copy']:.0f}%)".rjust(24))
                lines.append(f"    ctx {ctx:<5d}" + "".join(cells_t))
                lines.append("    " + " " * 9 + "".join(cells_b))
            for n in dict.fromkeys(r["tokens_per_row"] for r in rows if r["kind"] == "extend"):
                ext = [r for r in rows if r["kind"] == "extend" and r["tokens_per_row"] == n]
                cells = ", ".join(
                    f"b={r['batch']}: {fmt(r.get('graph_ms'))}/{fmt(r.get('eager_ms'))} ms {r['tok_per_s']:.0f} tok/s"
                    for r in ext
                )
                lines.append(f"    extend {n} tok/row ctx {ext[0]['context']} (graph/eager): {cells}")
        lines += self.targets()
        for e in o["errors"][:6]:
            lines.append(f"  ! {e[:120]}")
        if len(o["errors"]) > 6:
            lines.append(f"  ! ... {len(o['errors']) - 6} more errors in engine_bench.json")
        print("\n".join(lines))

    def targets(self) -> list[str]:
        out = []
        by = {(r["model"], r["kind"], r["batch"], r["context"]): r for r in self.out["timing"]}
        ctx = min(int(x) for x in self.args.contexts.split(","))
        r8 = by.get(("qwen3-8b", "decode", 1, ctx))
        if r8 and "graph_ms" in r8:
            pct = 100 * r8["bytes"] / (r8["graph_ms"] / 1e3) / 1e9 / self.copy_gbps
            out.append(f"  target qwen3-8b b=1 decode >= 85% copy bw: {pct:.0f}% -> {'PASS' if pct >= 85 else 'MISS'}")
        r06 = by.get(("qwen3-0.6b", "decode", 1, ctx))
        if r06 and "graph_ms" in r06:
            limit = 2 * r06["floor_ms"] + self.launch_us / 1e3
            ok = r06["graph_ms"] <= limit
            out.append(f"  target qwen3-0.6b b=1 step <= 2x bytes time + launch: {r06['graph_ms']:.3f} ms vs "
                       f"{limit:.3f} ms -> {'PASS' if ok else 'MISS'}")  # fmt: skip
        return out


# ---- batch helpers ---------------------------------------------------------------------------------------------
def make_requests(eng: Engine, batch: int, ctx: int) -> list[Request]:
    reqs = []
    vocab = eng.spec.vocab_size
    for i in range(batch):
        req = Request(f"r{i}", [(7 * j + i) % vocab for j in range(ctx)], ctx)
        if not eng.kv_pool.grow(req.pages, ctx):
            release(eng, reqs)
            raise RuntimeError(f"KV pool cannot hold {batch} x {ctx} tokens")
        reqs.append(req)
    return reqs


def release(eng: Engine, reqs: list[Request]) -> None:
    for r in reqs:
        eng.kv_pool.release(r.pages)


Plan = list[
    list[tuple[str, int | None, list[int]]]
]  # per step: (rid, tokens to feed or None = all new, appended first)


def correctness_plan(vocab: int, seed: int, long_prompts: bool) -> tuple[dict[str, list[int]], Plan]:
    """Prompts and steps of the correctness scenario: prefill of mixed lengths, decodes, 3-token peer-return
    extends, and a late prefill batched with decodes."""
    g = torch.Generator().manual_seed(seed)
    lens = [300, 17, 1000, 64] if long_prompts else [9, 3, 14, 5]
    prompts = {f"q{i}": torch.randint(0, vocab, (n,), generator=g).tolist() for i, n in enumerate(lens)}
    first = list(prompts)
    plan: Plan = [[(rid, None, []) for rid in first]]
    plan += [[(rid, 1, []) for rid in first] for _ in range(4)]
    plan += [[(rid, None, torch.randint(0, vocab, (3,), generator=g).tolist()) for rid in first]]
    plan += [[(rid, 1, []) for rid in first] for _ in range(2)]
    prompts["late"] = torch.randint(0, vocab, (20,), generator=g).tolist()
    plan += [[("late", None, [])] + [(rid, 1, []) for rid in first]]
    plan += [[(rid, 1, []) for rid in [*first, "late"]] for _ in range(2)]
    return prompts, plan


def run_plan(
    eng: Engine, prompts: dict[str, list[int]], plan: Plan, forced: dict | None = None, what: str = "correctness"
) -> dict[str, Any]:
    """Run `plan` on `eng` (pages grown through its KVPool, as a scheduler would). After each step the engine's
    greedy tokens are appended, or `forced`'s (another run's, so two engines see identical sequences). Returns
    each row's last-position logits, the appended tokens and the final sequences; frees the pages."""
    reqs = {rid: Request(rid, list(p), len(p)) for rid, p in prompts.items()}
    logs: list[tuple[str, int, torch.Tensor]] = []
    tokens: list[list[int]] = []
    try:
        for i, step in enumerate(plan):
            rows = []
            for rid, n, extra in step:
                req = reqs[rid]
                req.token_ids.extend(extra)
                start = req.num_computed
                n = req.num_tokens - start if n is None else n
                if not eng.kv_pool.grow(req.pages, start + n):
                    raise RuntimeError(f"KV pool too small for the {what} scenario")
                rows.append(BatchRow(req, start, n))
            res = eng.step(Batch(0, i, rows), return_logits=True).result()
            toks = forced["tokens"][i] if forced is not None else res.next_token_ids.tolist()
            tokens.append(toks)
            for row, lg, t in zip(rows, res.logits, toks, strict=True):
                logs.append((row.req.rid, row.start + row.num_tokens - 1, lg.detach().float().cpu()))
                row.req.num_computed = row.start + row.num_tokens
                row.req.token_ids.append(t)
    finally:
        release(eng, list(reqs.values()))
    return {"logits": logs, "tokens": tokens, "seqs": {rid: r.token_ids for rid, r in reqs.items()}}


def drive(engines: list[Engine], seed: int, long_prompts: bool = False) -> dict[str, Any]:
    """The correctness scenario on several engines, teacher-forced with engine 0's greedy tokens. Returns each
    engine's per-row logits and the final sequences."""
    prompts, plan = correctness_plan(engines[0].spec.vocab_size, seed, long_prompts)
    first = run_plan(engines[0], prompts, plan)
    runs = [first] + [run_plan(e, prompts, plan, forced=first) for e in engines[1:]]
    return {"logits": [r["logits"] for r in runs], "seqs": first["seqs"]}


def describe(eng: Engine) -> str:
    dtype = str(eng.dtype).removeprefix("torch.")
    graphs = "graphs" if eng.graphs_enabled else ("static-path" if eng.graphs is not None else "eager")
    return f"{dtype} {graphs} attn={eng.config.attention_backend} ops={eng.config.ops_backend}"


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def env_info(device: torch.device) -> dict[str, str]:
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "none"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "triton": tv, "device": name, "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (JSON + CSV)")
    p.add_argument("--smoke", action="store_true", help="tiny config, few steps (runs on CPU)")
    p.add_argument("--cpu", action="store_true", help="force CPU even when CUDA is present")
    p.add_argument("--models", default="qwen3-0.6b,qwen3-8b,qwen3-32b")
    p.add_argument("--batches", default="1,4,8,16,32")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--time-budget", type=float, default=400.0, help="seconds; later measurements are skipped")
    p.add_argument("--skip-correctness", action="store_true")
    args = p.parse_args(argv)
    args.extend_tokens = [4, 8]
    args.extend_batches = [1, 8, 32]
    if args.smoke:
        args.batches, args.contexts, args.max_steps = "1,2", "16,64", 5
        args.extend_batches = [1, 2]
    bench = Bench(args)
    print(f"engine bench on {bench.out['env']}", flush=True)
    try:
        bench.copy_bandwidth()
    except Exception as e:
        bench.error("copy bandwidth", e)
        bench.copy_gbps, bench.launch_us = float("nan"), 0.0
    if not args.skip_correctness:
        bench.correctness()
    bench.timing()
    bench.write()
    bench.summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
