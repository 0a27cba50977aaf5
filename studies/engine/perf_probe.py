#!/usr/bin/env python
"""Per-layer launch overhead of the engine's decode step on one GPU: where the time goes, what the new
launch switches save, and whether the bf16 error is just bf16. One run, < 4 minutes on an H200.

    python studies/engine/perf_probe.py --out OUT_DIR            # GPU
    python studies/engine/perf_probe.py --out OUT_DIR --smoke    # tiny config on CPU, checks the script

(a) Kernel breakdown of one graph-replayed decode step (b=1, ctx 1024, engine width 8256 tokens as in
    engine_bench) for Qwen3-0.6B and Qwen3-8B (dummy weights), baseline and default switches: torch.profiler
    (CUPTI records the kernels inside graph replays) over 20 replays; kernels classified (gemm, attention,
    attention reduce, norm, rope/KV store, activation, gather/embedding, argmax, other); us per layer by
    category (mean over the middle layers), busy (sum of kernel time) vs span (first start to last end) vs
    wall (event-timed replay without profiler); the kernel sequence of one middle layer; each GEMM's GB/s.
    Plus kernels per layer from the launch counter (the graph body run eagerly).
(b) bf16 noise reference: HF transformers bf16 vs HF fp32 on engine_bench's tiny random checkpoint and
    inputs, and at Qwen3-0.6B shapes (28 layers, our dummy weights loaded into HF), next to our bf16 engine
    against the same fp32 references.
(c) Decode step time (b=1, 8; ctx 1024) of the baseline, each switch alone and the default, each checked
    against our fp32 torch path at full depth (fresh random prompts, teacher-forced by the fp32 reference:
    max relative logit error, greedy agreement); a race/timing check of the fused split merge alone.
(d) If time remains: b=1 GEMV at the layer's 4 weight shapes, cuBLAS (F.linear) vs a plain Triton GEMV, and
    SiLU(gate)*up folded into the down-projection GEMV vs our SwiGLU kernel + cuBLAS, weights rotated over
    copies larger than L2: can our own GEMV absorb the norm/SwiGLU launches without losing bandwidth?

Writes OUT_DIR/perf_probe.json (everything), variants.csv, kernels_<model>_<variant>.csv, noise.csv, and
prints a summary (< 40 lines) last. Every part is guarded: a failure is recorded and the run goes on.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton

# The working tree's package (not an installed copy) and the sibling engine_bench script.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench as eb
import graph_timing as gt

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.engine.config import BASELINE_SWITCHES
from tokenrouter.engine.launch_count import count_graph_body_launches
from tokenrouter.engine.runner import Engine
from tokenrouter.models.spec import load_spec

VARIANTS: dict[str, dict[str, bool]] = {
    "baseline": dict(BASELINE_SWITCHES),
    "no_pdl": {"triton_pdl": False},  # the default without PDL
    "default": {},
    "fused_reduce": {**BASELINE_SWITCHES, "decode_fused_reduce": True},
    "step_fusion": {**BASELINE_SWITCHES, "fuse_step_ops": True},
    "pdl": {**BASELINE_SWITCHES, "triton_pdl": True},
}
# Always run and profiled; the others only while the time budget lasts. With PDL a kernel starts before its
# predecessor ends and its profiled duration includes that wait, so no_pdl gives the clean categories.
CORE = ("baseline", "no_pdl", "default")
CATEGORIES = ("gemm", "attention", "attn_reduce", "norm", "rope_store", "act", "gather", "argmax", "other")
LETTER = {"gemm": "G", "attention": "A", "attn_reduce": "R", "norm": "N", "rope_store": "P", "act": "S", "gather": "X",
          "argmax": "M", "other": "O"}  # fmt: skip
WIDTH = 8256  # engine_bench's max_context_len (8192 + 64): decides the split count (33 at b=1, Hkv 8)


# ---- kernel classification and trace analysis (pure functions, exercised by --smoke) -------------------------
def category(name: str) -> str:
    n = name.lower()
    if "paged_attention_fwd" in n:
        return "attention"
    if "split_reduce" in n:
        return "attn_reduce"
    if "rms_norm" in n:
        return "norm"
    if "qk_norm_rope" in n:
        return "rope_store"
    if "silu" in n:
        return "act"
    if "argmax" in n:
        return "argmax"
    gemm_keys = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitk", "torch.mm", "matmul", "sm90_")
    if any(k in n for k in gemm_keys):
        return "gemm"
    if "index" in n or "embedding" in n or "gather" in n:
        return "gather"
    return "other"


def split_replays(events: list[dict], n: int) -> list[list[dict]]:
    """Group kernel events of n back-to-back replays: by correlation id (one per cudaGraphLaunch), else by
    the idle gaps between replays, else in equal chunks."""
    events = sorted(events, key=lambda e: e["ts"])
    by_corr: dict[Any, list[dict]] = {}
    for e in events:
        by_corr.setdefault(e.get("corr"), []).append(e)
    groups = list(by_corr.values())
    if len(groups) == n and len({len(g) for g in groups}) == 1:
        return sorted(groups, key=lambda g: g[0]["ts"])
    gaps = sorted((events[i + 1]["ts"] - (events[i]["ts"] + events[i]["dur"]), i) for i in range(len(events) - 1))
    cut = sorted(i for _, i in gaps[-(n - 1) :]) if n > 1 else []
    groups, start = [], 0
    for i in [*cut, len(events) - 1]:
        groups.append(events[start : i + 1])
        start = i + 1
    if len({len(g) for g in groups}) == 1:
        return groups
    k = len(events) // n
    return [events[i * k : (i + 1) * k] for i in range(n)]


def profile_graph(g, s, n: int, tmp: Path) -> tuple[list[dict], list[list[dict]]]:
    """torch.profiler over n replays of graph `g` on stream `s` (CUPTI records the kernels inside graph replays):
    (`representative` kernels of one replay, the kernels of every replay)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.cuda.stream(s):
        for _ in range(3):
            g.replay()
        s.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                g.replay()
                s.synchronize()
    path = tmp / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    path.unlink()
    evs = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0)),
            "corr": (e.get("args") or {}).get("correlation")}
           for e in trace if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]  # fmt: skip
    if not evs:
        raise RuntimeError("the profiler recorded no kernels inside the graph replays")
    replays = split_replays(evs, n)
    return representative(replays[1:] if len(replays) > 2 else replays), replays


def representative(replays: list[list[dict]]) -> list[dict]:
    """One replay: names of the first, per-position median duration and start offset over all of them."""
    base = replays[0]
    out = []
    for i, e in enumerate(base):
        durs = [r[i]["dur"] for r in replays if i < len(r)]
        offs = [r[i]["ts"] - r[0]["ts"] for r in replays if i < len(r)]
        out.append({"name": e["name"], "dur": statistics.median(durs), "off": statistics.median(offs)})
    return out


def analyze(kernels: list[dict], num_layers: int, gemm_bytes: list[int] | None = None) -> dict[str, Any]:
    """Per-layer category times (mean over the middle layers), busy/span, layer kernel sequence, GEMM GB/s.
    Layers are delimited by the norm kernels: a layer is [input norm, next layer's input norm); the step has
    2 L + 1 of them (the last is the final norm)."""
    for k in kernels:
        k["cat"] = category(k["name"])
    busy = sum(k["dur"] for k in kernels)
    span = max(k["off"] + k["dur"] for k in kernels) - min(k["off"] for k in kernels) if kernels else 0.0
    res: dict[str, Any] = {"kernels": len(kernels), "busy_us": busy, "span_us": span}
    norms = [i for i, k in enumerate(kernels) if k["cat"] == "norm"]
    if len(norms) != 2 * num_layers + 1 or num_layers < 1:
        res["layer_error"] = f"{len(norms)} norm kernels for {num_layers} layers; per-layer split skipped"
        res["per_layer"] = {c: sum(k["dur"] for k in kernels if k["cat"] == c) / max(num_layers, 1) for c in CATEGORIES}
        return res
    bounds = [(norms[2 * i], norms[2 * i + 2]) for i in range(num_layers)]
    for i, (a, b) in enumerate(bounds):
        for k in kernels[a:b]:
            k["layer"] = i
    mids = bounds[1:-1] if num_layers > 2 else bounds[:1]
    per = {c: 0.0 for c in CATEGORIES}
    gaps, counts = [], []
    for a, b in mids:
        for k in kernels[a:b]:
            per[k["cat"]] += k["dur"] / len(mids)
        gaps.append(kernels[b]["off"] - kernels[a]["off"] - sum(k["dur"] for k in kernels[a:b]))
        counts.append(b - a)
    res["per_layer"] = per
    res["layer_busy_us"] = sum(per.values())
    res["layer_gap_us"] = statistics.mean(gaps)
    res["layer_kernels"] = statistics.mean(counts)
    res["outside_layers_busy_us"] = busy - num_layers * res["layer_busy_us"]  # embedding, head, sampling
    a, b = mids[len(mids) // 2]
    res["layer_sequence"] = [(k["cat"], round(k["dur"], 2), k["name"][:90]) for k in kernels[a:b]]
    # GEMM groups: consecutive gemm kernels (a split-K GEMM shows as gemm + its reduce).
    groups: list[float] = []
    prev = False
    for k in kernels[a:b]:
        if k["cat"] == "gemm":
            if prev:
                groups[-1] += k["dur"]
            else:
                groups.append(k["dur"])
        prev = k["cat"] == "gemm"
    res["gemm_us"] = groups
    if gemm_bytes and len(groups) == len(gemm_bytes):
        res["gemm_gbps"] = [nb / (us * 1e-6) / 1e9 for nb, us in zip(gemm_bytes, groups, strict=True)]
    return res


def layer_gemm_bytes(spec) -> list[int]:
    """Weight bytes of the 4 GEMMs of a layer in launch order: qkv, o, gate|up, down (bf16)."""
    h, q, kv, i = (
        spec.hidden_size,
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
        spec.intermediate_size,
    )
    return [2 * h * (q + 2 * kv), 2 * q * h, 2 * h * 2 * i, 2 * i * h]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


# ---- the probe -----------------------------------------------------------------------------------------------
class Probe(eb.Harness):
    def __init__(self, args: argparse.Namespace) -> None:
        self.start(args, torch.cuda.is_available() and not args.smoke, "perf_probe_")
        self.out: dict[str, Any] = {
            "env": eb.env_info(self.device), "errors": [], "variants": [], "profiles": {}, "noise": [],
            "attention": {}, "skipped": [],
        }  # fmt: skip
        self.bench = eb.Bench(SimpleNamespace(cpu=not self.cuda))  # for its tiny checkpoint and helpers

    # ---- environment ------------------------------------------------------------------------------------------
    def environment(self) -> None:
        self.bench.copy_bandwidth()
        self.copy_gbps = self.bench.copy_gbps
        self.out["copy_gbps"] = self.copy_gbps
        self.out["graph_launch_us"] = self.bench.launch_us

    # ---- (c') the fused split merge alone: races and time -------------------------------------------------------
    def attention_check(self) -> None:
        from tokenrouter.engine.attention import decode_attention, split_counters

        dev, dt = self.device, (torch.bfloat16 if self.cuda else torch.float32)
        backend = "triton" if self.cuda else "torch"
        page, dim = 16, 128
        res: dict[str, Any] = {}
        gen = torch.Generator(device=dev).manual_seed(5)
        for hq, hkv, b in ((32, 8, 1), (32, 8, 8), (16, 8, 1), (64, 8, 4)):
            width = WIDTH // page + 1 if self.cuda else 8
            pages = b * width + 1
            kc = torch.randn(pages, page, hkv, dim, device=dev, dtype=dt, generator=gen)
            vc = torch.randn(pages, page, hkv, dim, device=dev, dtype=dt, generator=gen)
            bt = (torch.randperm(pages - 1, device=dev, generator=gen)[: b * width] + 1).view(b, width).int()
            errs: dict[str, float] = {"reduce": 0.0, "fused": 0.0}
            ctr = split_counters(b, hkv, dev)
            trials = 12 if self.cuda else 2
            for t in range(trials):
                hi = width * page if t % 3 else min(1100, width * page)
                lens = torch.randint(1, hi + 1, (b,), device=dev, generator=gen).int()
                q = torch.randn(b, hq, dim, device=dev, dtype=dt, generator=gen)
                ref = decode_attention(q, kc, vc, bt, lens, dim**-0.5, backend="torch")
                for name, c in (("reduce", None), ("fused", ctr)):
                    o = torch.full_like(q, float("nan"))
                    decode_attention(q, kc, vc, bt, lens, dim**-0.5, out=o, backend=backend, counters=c)
                    errs[name] = max(errs[name], rel(o, ref) if not o.isnan().any() else float("inf"))
            errs["counters_zero"] = bool(ctr.eq(0).all())
            if self.cuda:
                errs.update(self.attention_graph_times(q, kc, vc, bt, hkv))
            res[f"hq{hq}_hkv{hkv}_b{b}"] = errs
            self.log(f"attention merge check hq={hq} hkv={hkv} b={b}: {errs}")
        self.out["attention"] = res

    def attention_graph_times(self, q, kc, vc, bt, hkv) -> dict[str, float]:
        """us per decode-attention call at ctx 1024 (width 8256), 32 calls per graph (like layers)."""
        from tokenrouter.engine.attention import decode_attention, split_counters

        b = q.shape[0]
        lens = torch.full((b,), 1024, device=q.device, dtype=torch.int32)
        out = {}
        for name, fused, pdl in (("us_reduce", False, False), ("us_fused", True, False), ("us_fused_pdl", True, True)):
            ctr = split_counters(b, hkv, q.device) if fused else None
            o = torch.empty_like(q)

            def body(ctr=ctr, o=o, pdl=pdl):
                for _ in range(32):
                    decode_attention(q, kc, vc, bt, lens, 0.088, out=o, backend="triton", counters=ctr, pdl=pdl)

            out[name] = gt.capture_and_time(body, n=50, per=32).median_us
        return out

    # ---- (b) bf16 noise on the tiny checkpoint ----------------------------------------------------------------
    def tiny_noise(self) -> None:
        """engine_bench's tiny checkpoint and inputs (drive seed 1, teacher-forced by engine 0): baseline is
        engine 0, as the default engine was when engine_bench measured 3.4e-2."""
        try:
            path = self.bench.tiny_dir(hf=True)
        except ImportError as e:
            self.error("transformers unavailable, noise check skipped", e)
            return
        kw = {"num_pages": 512, "max_context_len": 1024, "graph_buckets": (1, 2, 4, 8, 16, 32)}
        engines = {
            "ours bf16 baseline": self.engine(str(path), **kw, **VARIANTS["baseline"]),
            "ours bf16 default": self.engine(str(path), **kw),
            "ours fp32 torch": self.engine(str(path), **{**kw, **eb.FP32_REF}),
        }
        recs = eb.drive(list(engines.values()), seed=1)
        ours = dict(zip(engines, recs["logits"], strict=True))
        hf = self.bench.hf_tiny.to(self.device)
        self.noise_table("tiny", hf, recs["seqs"], ours)
        for e in engines.values():
            e.close()

    def noise_table(self, case: str, hf32, seqs: dict[str, list[int]], ours: dict[str, list]) -> None:
        """HF fp32 and bf16 logits at the recorded rows; every comparison: max and median rel err, agreement."""
        rows = next(iter(ours.values()))
        need = sorted({(rid, pos) for rid, pos, _ in rows})

        @torch.no_grad()
        def hf_logits(model) -> dict[tuple[str, int], torch.Tensor]:
            got = {}
            for rid, ids in seqs.items():
                pos = [p for r, p in need if r == rid]
                if not pos:
                    continue
                h = model.model(input_ids=torch.tensor([ids], device=self.device)).last_hidden_state[0]
                lg = model.lm_head(h[torch.tensor(pos, device=self.device)]).float().cpu()
                got.update({(rid, p): lg[i] for i, p in enumerate(pos)})
            return got

        hf32.eval().float()
        ref32 = hf_logits(hf32)
        hf16 = hf32.to(torch.bfloat16)
        ref16 = hf_logits(hf16)
        refs = {"HF fp32": ref32, "HF bf16": ref16}
        pairs = [("HF bf16", "HF fp32")] + [(name, "HF fp32") for name in ours] + [("ours bf16 default", "HF bf16")]
        for a, b in pairs:
            la = refs[a] if a in refs else {(rid, pos): lg for rid, pos, lg in ours[a]}
            lb = refs[b]
            errs = [rel(la[k], lb[k]) for k in need]
            agree = sum(int(la[k].argmax()) == int(lb[k].argmax()) for k in need) / len(need)
            row = {"case": case, "test": a, "ref": b, "max_rel": max(errs), "median_rel": statistics.median(errs),
                   "greedy_agree": agree, "rows": len(need)}  # fmt: skip
            self.out["noise"].append(row)
            self.log(
                f"noise {case}: {a} vs {b}: max {row['max_rel']:.2e} median {row['median_rel']:.2e} agree {agree:.0%}"
            )
        del hf16

    # ---- (a) + (c) per model ------------------------------------------------------------------------------
    def model_dir(self, name: str) -> str:
        if name != "tiny":
            return name
        return str(self.bench.tiny_dir(hf=False))

    def run_model(self, name: str) -> None:
        model = self.model_dir(name)
        spec = load_spec(model)
        ref, ref_run = None, None
        names = list(VARIANTS) if not self.args.variants else self.args.variants.split(",")
        for vname in names:
            core = vname in CORE
            if self.elapsed() > (self.args.hard_budget if core else self.args.budget):
                self.out["skipped"].append(f"{name} {vname}")
                self.log(f"skip {name} {vname}: time budget")
                continue
            eng = None
            try:
                t = time.perf_counter()
                eng = self.engine(model, load_format="dummy", num_pages=self.pages(spec), max_context_len=WIDTH,
                                  graph_buckets=(1, 8, 16, 32), **VARIANTS[vname])  # fmt: skip
                rec: dict[str, Any] = {
                    "model": name, "variant": vname, "build_s": time.perf_counter() - t, "pdl": eng.pdl,
                    "pdl_error": eng.pdl_error, "graph_error": eng.graph_error, "graphs": eng.graphs_enabled,
                }  # fmt: skip
                note = f" pdl_error={eng.pdl_error}" if eng.pdl_error else ""
                self.log(f"[{name}] {vname}: engine ready ({rec['build_s']:.1f}s) pdl={eng.pdl} "
                         f"graphs={eng.graphs_enabled}{note}")  # fmt: skip
                if ref is None:
                    ref = self.engine(model, load_format="dummy", num_pages=256, max_context_len=2048, **eb.FP32_REF)
                    with torch.no_grad():
                        for p_ref, p in zip(ref.model.parameters(), eng.model.parameters(), strict=True):
                            p_ref.copy_(p)
                    ref_run = scenario(ref, seed=self.args.seed, long_prompts=self.cuda)
                    self.log(f"[{name}] fp32 reference ready")
                for b in (1, 8):
                    rec.update(self.time_decode(eng, b))
                rec.update(self.launches(eng))
                if core:
                    prof = self.guarded(f"profile {name} {vname}", self.profile, eng, spec, vname)
                    if prof is not None:
                        self.out["profiles"][f"{name}/{vname}"] = prof
                run = scenario(eng, seed=self.args.seed, long_prompts=self.cuda, forced=ref_run)
                errs = [rel(a, b) for (_, _, a), (_, _, b) in zip(run["logits"], ref_run["logits"], strict=True)]
                agree = [int(a.argmax()) == int(b.argmax()) for (_, _, a), (_, _, b) in
                         zip(run["logits"], ref_run["logits"], strict=True)]  # fmt: skip
                rec.update(corr_max_rel=max(errs), corr_median_rel=statistics.median(errs),
                           corr_agree=sum(agree) / len(agree), corr_rows=len(agree))  # fmt: skip
                if eng.split_counters is not None:
                    rec["counters_zero"] = bool(eng.split_counters.eq(0).all())
                self.out["variants"].append(rec)
                shown = (f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()
                         if k not in ("model", "variant", "launches_layer_list"))  # fmt: skip
                self.log(f"[{name}] {vname}: " + ", ".join(shown))
                if name in ("qwen3-0.6b", "tiny") and vname == "default":
                    self.guarded(f"noise {name}", self.model_noise, name, spec, ref, ref_run, run)
            except Exception as e:
                self.error(f"{name} {vname}", e)
            finally:
                if eng is not None:
                    eng.close()
                del eng
                self.free()
        if ref is not None:
            ref.close()
        del ref
        self.free()

    def pages(self, spec) -> int:
        return 8 * math.ceil(1024 / 16) + WIDTH // 16 + 64 if self.cuda else 700

    def model_noise(self, name, spec, ref, ref_run, run) -> None:
        """HF bf16 vs HF fp32 with our dummy weights at real shapes, on the scenario's rows."""
        from transformers import AutoConfig, AutoModelForCausalLM

        raw = {k: v for k, v in (spec.raw or {}).items() if not k.startswith("_")}
        cfg = AutoConfig.for_model(
            raw.get("model_type", "qwen3"), **{k: v for k, v in raw.items() if k != "model_type"}
        )
        with torch.device(self.device):
            hf = AutoModelForCausalLM.from_config(cfg)
        hf = hf.float().eval()
        sd = hf.state_dict()
        with torch.no_grad():
            for hf_name, (param, rows) in ref.model.checkpoint_params().items():
                sd[hf_name].copy_(param.data if rows is None else param.data[rows])
            if spec.tie_word_embeddings and "lm_head.weight" in sd:
                sd["lm_head.weight"].copy_(ref.model.embed_tokens.data)
        ours = {"ours fp32 torch": ref_run["logits"], "ours bf16 default": run["logits"]}
        self.noise_table(f"{name} x{spec.num_layers}", hf, ref_run["seqs"], ours)
        del hf, sd

    def time_decode(self, eng: Engine, b: int, ctx: int = 1024) -> dict[str, float]:
        reqs = eb.make_requests(eng, b, ctx)
        bat = Batch(0, 0, [BatchRow(r, ctx - 1, 1) for r in reqs])
        out: dict[str, float] = {}
        try:
            steps = (60 if eng.spec.num_layers > 30 else 120) if self.cuda else 3
            rounds = []
            for _ in range(2):
                for _ in range(3):
                    eng.step(bat)
                self.sync()
                t = time.perf_counter()
                for _ in range(steps):
                    eng.step(bat)
                self.sync()
                rounds.append((time.perf_counter() - t) / steps * 1e3)
            out[f"step_ms_b{b}"] = min(rounds)
            out[f"step_spread_b{b}"] = abs(rounds[0] - rounds[1]) / min(rounds)
            bucket = eng.graph_bucket_for(bat)
            if self.cuda and eng.graphs_enabled and bucket in eng.graphs.graphs:
                eng.step(bat)
                g = eng.graphs.graphs[bucket]
                reps = [gt.time_replays(g.replay, eng.stream, n=40).median_us / 1e3 for _ in range(2)]
                out[f"replay_ms_b{b}"] = min(reps)
            spec = eng.spec
            nbytes = spec.decode_weight_bytes + b * ctx * spec.kv_bytes_per_token
            if self.cuda:
                out[f"pct_copy_b{b}"] = 100 * nbytes / (out[f"step_ms_b{b}"] / 1e3) / 1e9 / self.copy_gbps
                out[f"floor_ms_b{b}"] = nbytes / (self.copy_gbps * 1e9) * 1e3
        finally:
            eb.release(eng, reqs)
        return out

    def launches(self, eng: Engine) -> dict[str, Any]:
        """Kernels of one b=1 graph body from the launch counter (torch ops + Triton launches)."""
        if eng.graphs is None:
            return {}
        reqs = eb.make_requests(eng, 1, 64)
        try:
            lc = count_graph_body_launches(eng, Batch(0, 0, [BatchRow(reqs[0], 63, 1)]))
            per = lc.per_layer()
            return {"launches_per_layer": per[min(1, len(per) - 1)], "launches_step": len(lc.sections.get("step", [])),
                    "launches_layer_list": lc.layer_kernels(min(1, len(per) - 1))}  # fmt: skip
        finally:
            eb.release(eng, reqs)

    def profile(self, eng: Engine, spec, vname: str) -> dict[str, Any] | None:
        """torch.profiler over 20 graph replays of a b=1, ctx 1024 decode step; see `analyze`."""
        if not (self.cuda and eng.graphs_enabled):
            return self.profile_smoke(eng, spec, vname)

        reqs = eb.make_requests(eng, 1, 1024)
        bat = Batch(0, 0, [BatchRow(reqs[0], 1023, 1)])
        try:
            bucket = eng.graph_bucket_for(bat)
            eng.step(bat)
            self.sync()
            g, s, n = eng.graphs.graphs[bucket], eng.stream, 20
            wall = gt.time_replays(g.replay, s, n=40).median_us
            kernels, replays = profile_graph(g, s, n, self.tmp)
            res = analyze(kernels, spec.num_layers, layer_gemm_bytes(spec))
            res["wall_us"] = wall
            res["span_spread_us"] = statistics.pstdev(max(e["ts"] + e["dur"] for e in r) - r[0]["ts"] for r in replays)
            self.write_kernels(eng, kernels, vname)
            return res
        finally:
            eb.release(eng, reqs)

    def profile_smoke(self, eng: Engine, spec, vname: str) -> dict[str, Any] | None:
        """CPU smoke run: the launch counter's kernel list with made-up durations through `analyze`."""
        reqs = eb.make_requests(eng, 1, 40)
        try:
            lc = count_graph_body_launches(eng, Batch(0, 0, [BatchRow(reqs[0], 39, 1)]))
            kernels, off = [], 0.0
            for _, name in lc.events:
                dur = 10.0 if category(name) == "gemm" else 2.0
                kernels.append({"name": name, "dur": dur, "off": off})
                off += dur + 1.0
            res = analyze(kernels, spec.num_layers, layer_gemm_bytes(spec))
            res["wall_us"] = off
            self.write_kernels(eng, kernels, vname)
            return res
        finally:
            eb.release(eng, reqs)

    def write_kernels(self, eng: Engine, kernels: list[dict], variant: str) -> None:
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = eng.spec.name.replace("/", "_")
        with open(out / f"kernels_{name}_{variant}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["pos", "layer", "category", "dur_us", "start_us", "name"])
            for i, k in enumerate(kernels):
                w.writerow([i, k.get("layer", ""), k["cat"], f"{k['dur']:.3f}", f"{k['off']:.3f}", k["name"]])

    # ---- (d) GEMV: cuBLAS vs Triton, SwiGLU folded into the down projection ---------------------------------------
    def gemv_check(self) -> None:
        if not self.cuda:
            return
        from tokenrouter.engine import triton_ops

        kernel = _gemv_kernel()
        res: dict[str, Any] = {}
        for name in self.args.models.split(","):
            if self.elapsed() > self.args.budget:
                self.out["skipped"].append(f"gemv {name}")
                continue
            spec = load_spec(name)
            h, q = spec.hidden_size, spec.num_heads * spec.head_dim
            kv, inter = spec.num_kv_heads * spec.head_dim, spec.intermediate_size
            shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h), "down": (h, inter)}
            row: dict[str, Any] = {}
            for op, (n, k) in shapes.items():
                copies = max(2, math.ceil(256e6 / (2 * n * k)))
                ws = [torch.randn(n, k, device=self.device, dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
                x = torch.randn(1, 2 * k if op == "down" else k, device=self.device, dtype=torch.bfloat16)
                xin = x[:, :k] if op != "down" else triton_ops.silu_and_mul(x)
                y = torch.empty(1, n, device=self.device, dtype=torch.bfloat16)
                ref = torch.nn.functional.linear(xin, ws[0])
                row[f"{op}_cublas_us"] = self.graph_us(
                    lambda ws=ws, xin=xin: [torch.mm(xin, w.t()) for w in ws], copies
                )
                best = (float("inf"), None)
                for bn, bk in ((4, 1024), (8, 1024), (16, 512)):
                    grid = (triton.cdiv(n, bn),)

                    def tri(ws=ws, xin=xin, y=y, bn=bn, bk=bk, grid=grid, n=n, k=k):
                        for w in ws:
                            kernel[grid](xin, w, y, n, k, w.stride(0), SILU=False, BLOCK_N=bn, BLOCK_K=bk,
                                         num_warps=4, num_stages=3)  # fmt: skip

                    err = rel(_one(kernel, xin, ws[0], n, k, bn, bk), ref)
                    us = self.graph_us(tri, copies)
                    if us < best[0]:
                        best = (us, (bn, bk, err))
                row[f"{op}_triton_us"], row[f"{op}_triton_cfg"] = best
                row[f"{op}_bytes"] = 2 * n * k
                if op == "down":
                    bn, bk, _ = best[1]
                    grid = (triton.cdiv(n, bn),)
                    row["silu_down_unfused_us"] = self.graph_us(
                        lambda ws=ws, x=x: [torch.mm(triton_ops.silu_and_mul(x), w.t()) for w in ws], copies
                    )

                    def fused(ws=ws, x=x, y=y, bn=bn, bk=bk, grid=grid, n=n, k=k):
                        for w in ws:
                            kernel[grid](x, w, y, n, k, w.stride(0), SILU=True, BLOCK_N=bn, BLOCK_K=bk,
                                         num_warps=4, num_stages=3)  # fmt: skip

                    fused()
                    row["silu_down_fused_err"] = rel(y, torch.nn.functional.linear(xin, ws[-1]))
                    row["silu_down_fused_us"] = self.graph_us(fused, copies)
                del ws
                self.free()
            res[name] = row
            self.log(f"gemv {name}: {row}")
        self.out["gemv"] = res

    def graph_us(self, body, copies: int) -> float:
        """us per weight copy of `body` (one op per copy) captured in one graph."""
        return gt.capture_and_time(body, n=20, per=copies, warmup_calls=1).median_us

    # ---- output -----------------------------------------------------------------------------------------------
    def write(self) -> None:
        self.write_outputs("perf_probe.json", {"variants.csv": self.out["variants"], "noise.csv": self.out["noise"]})

    def summary(self) -> None:
        o, env = self.out, self.out["env"]
        L = ["=" * 118]
        L.append(f"PERF PROBE {env['device']} torch {env['torch']} triton {env['triton']} | copy "
                 f"{o.get('copy_gbps', 0):.0f} GB/s | graph launch {o.get('graph_launch_us', 0):.1f} us | "
                 f"{self.elapsed():.0f} s")  # fmt: skip
        L.append(
            "[a] graph decode b=1 ctx1024, us per layer (middle layers) | kern/layer | per step: busy/span/wall us"
        )
        L.append(f"    {'':20s}{'gemm':>7s}{'attn':>6s}{'red':>5s}{'norm':>6s}{'rope':>6s}{'act':>6s}{'oth':>6s}"
                 f"{'gap':>6s}{'sum':>7s}{'kern':>6s}   busy/span/wall")  # fmt: skip
        for key, p in o["profiles"].items():
            per = p.get("per_layer", {})
            cells = [per.get(c, 0) for c in ("gemm", "attention", "attn_reduce", "norm", "rope_store", "act")]
            other = sum(per.get(c, 0) for c in ("gather", "argmax", "other"))
            gap = p.get("layer_gap_us", float("nan"))
            tot = p.get("layer_busy_us", sum(per.values())) + (0 if math.isnan(gap) else gap)
            L.append(f"    {key:20s}{cells[0]:7.1f}{cells[1]:6.1f}{cells[2]:5.1f}{cells[3]:6.1f}{cells[4]:6.1f}"
                     f"{cells[5]:6.1f}{other:6.1f}{gap:6.1f}{tot:7.1f}{p.get('layer_kernels', float('nan')):6.1f}   "
                     f"{p['busy_us']:.0f}/{p['span_us']:.0f}/{p.get('wall_us', 0):.0f}")  # fmt: skip
        for key, p in o["profiles"].items():
            if key.endswith("/baseline") and "gemm_us" in p:
                gb = p.get("gemm_gbps")
                g = " ".join(f"{u:.1f}" + (f"({gb[i]:.0f})" if gb else "") for i, u in enumerate(p["gemm_us"]))
                L.append(f"    {key:20s}qkv/o/gate_up/down GEMM us (GB/s): {g}; outside layers "
                         f"{p.get('outside_layers_busy_us', 0):.0f} us busy")  # fmt: skip
        for key, p in o["profiles"].items():
            if key.split("/")[-1] in ("baseline", "no_pdl") and key.startswith(self.args.models.split(",")[0]):
                seq = " ".join(f"{LETTER[c]}{d:.1f}" for c, d, _ in p.get("layer_sequence", []))
                L.append(f"    {key:20s}layer us (G gemm A attn R reduce N norm P rope S swiglu O other): {seq}"[:180])
        L.append(
            "[b] bf16 noise, max rel logit err (median rows) greedy agree; ours = engine (bf16 default unless named)"
        )
        short = {"HF bf16": "HFbf16", "HF fp32": "HF32", "ours bf16 default": "ours", "ours bf16 baseline": "ours-base",
                 "ours fp32 torch": "ours32"}  # fmt: skip
        for case in dict.fromkeys(r["case"] for r in o["noise"]):
            rows = [r for r in o["noise"] if r["case"] == case]
            cells = [f"{short.get(r['test'], r['test'])}/{short.get(r['ref'], r['ref'])} {r['max_rel']:.1e}"
                     f"({r['median_rel']:.0e}){r['greedy_agree']:.0%}" for r in rows]  # fmt: skip
            L.append(f"    {case} ({rows[0]['rows']} rows): " + " | ".join(cells))
        L.append("[c] decode step ms (graph step / replay), ctx 1024; %copy b=1; launches/layer+step; corr vs fp32")
        for r in o["variants"]:

            def cell(b, r=r):
                s, rp = r.get(f"step_ms_b{b}"), r.get(f"replay_ms_b{b}")
                return f"{s:.3f}/{rp:.3f}" if s is not None and rp is not None else (f"{s:.3f}/-" if s else "-")

            pct = r.get("pct_copy_b1")
            flags = ("" if r.get("graphs", True) else " NO-GRAPHS") + (" PDL-OFF" if r.get("pdl_error") else "")
            if r.get("counters_zero") is False:
                flags += " COUNTERS!"
            launches = f"{r.get('launches_per_layer', '-')}+{r.get('launches_step', '-')}"
            corr = f"rel {r.get('corr_max_rel', float('nan')):.1e} agree {r.get('corr_agree', float('nan')):.0%}"
            pct_s = f"{pct:.0f}%" if pct else "-"
            L.append(f"    {r['model']:10s} {r['variant']:12s} b1 {cell(1):>13s} b8 {cell(8):>13s} {pct_s:>4s} "
                     f"{launches:>6s} {corr}{flags}")  # fmt: skip
        att = o.get("attention") or {}
        if att:
            bits = []
            for k, v in att.items():
                t = f" {v['us_reduce']:.1f}/{v['us_fused']:.1f}/{v['us_fused_pdl']:.1f}us" if "us_reduce" in v else ""
                bits.append(f"{k} {v['reduce']:.0e}/{v['fused']:.0e}{'' if v['counters_zero'] else ' CTR!'}{t}")
            L.append(
                "    attention alone, rel err reduce/fused, us per call (ctx 1k, 32/graph) reduce/fused/fused+pdl:"
            )
            L.append("      " + "; ".join(bits))
        for name, g in (o.get("gemv") or {}).items():
            cells = [
                f"{op} {g[op + '_cublas_us']:.1f}/{g[op + '_triton_us']:.1f}" for op in ("qkv", "o", "gate_up", "down")
            ]
            L.append(f"[d] {name} b=1 GEMV us cuBLAS/Triton: {' '.join(cells)} | silu+down "
                     f"{g['silu_down_unfused_us']:.1f} vs folded {g['silu_down_fused_us']:.1f} "
                     f"(err {g['silu_down_fused_err']:.0e})")  # fmt: skip
        if o["skipped"]:
            L.append(f"  skipped (time budget): {', '.join(o['skipped'])}"[:170])
        for e in o["errors"][:2]:
            L.append(f"  ! {e[:150]}")
        if len(o["errors"]) > 2:
            L.append(f"  ! ... {len(o['errors']) - 2} more errors in perf_probe.json")
        print("\n".join(L))


# ---- a plain Triton GEMV for (d) ----------------------------------------------------------------------------------
_GEMV = None


def _gemv_kernel():
    """y[n] = sum_k W[n, k] x[k] for one row (b=1); SILU: x = SiLU(x[:K]) * x[K:2K] rounded like HF. Built on
    first use so importing this script never decorates a kernel (tests import it under the interpreter)."""
    global _GEMV
    if _GEMV is not None:
        return _GEMV
    import triton.language as tl

    @triton.jit
    def gemv(X, W, Y, N, K, stride_w, SILU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(W + rows[:, None].to(tl.int64) * stride_w + cols[None, :], mask=rmask[:, None], other=0.0)
            if SILU:
                g = tl.load(X + cols).to(tl.float32)
                u = tl.load(X + K + cols).to(tl.float32)
                x = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u
                x = x.to(tl.bfloat16).to(tl.float32)
            else:
                x = tl.load(X + cols).to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
        tl.store(Y + rows, tl.sum(acc, 1).to(Y.dtype.element_ty), mask=rmask)

    _GEMV = gemv
    return gemv


def _one(kernel, x, w, n, k, bn, bk) -> torch.Tensor:
    y = torch.empty(1, n, device=x.device, dtype=x.dtype)
    kernel[(triton.cdiv(n, bn),)](x, w, y, n, k, w.stride(0), SILU=False, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return y


# ---- scenario (engine_bench.drive for one engine, optionally teacher-forced) ------------------------------------
def scenario(eng: Engine, seed: int, long_prompts: bool, forced: dict | None = None) -> dict[str, Any]:
    """engine_bench's correctness scenario on one engine, optionally teacher-forced by an earlier run."""
    return eb.run_plan(eng, *eb.correctness_plan(eng.spec.vocab_size, seed, long_prompts), forced)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (JSON + CSV)")
    p.add_argument("--smoke", action="store_true", help="tiny config on CPU: checks the script, not the GPU")
    p.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    p.add_argument("--variants", default="", help=f"comma list of {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--seed", type=int, default=7, help="prompt seed of the correctness scenario (bench used 2)")
    p.add_argument("--budget", type=float, default=185.0, help="seconds; non-core variants after this are skipped")
    p.add_argument("--hard-budget", type=float, default=215.0, help="seconds; nothing new starts after this")
    p.add_argument("--no-gemv", action="store_true", help="skip (d), the GEMV comparison")
    args = p.parse_args(argv)
    probe = Probe(args)
    print(f"perf probe on {probe.out['env']}", flush=True)
    probe.guarded("environment", probe.environment)
    if not hasattr(probe, "copy_gbps"):
        probe.copy_gbps = float("nan")
    probe.guarded("attention check", probe.attention_check)
    probe.guarded("tiny noise", probe.tiny_noise)
    for name in ["tiny"] if args.smoke else args.models.split(","):
        probe.guarded(f"model {name}", probe.run_model, name)
    if not args.no_gemv:
        probe.guarded("gemv", probe.gemv_check)
    probe.write()
    probe.summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
