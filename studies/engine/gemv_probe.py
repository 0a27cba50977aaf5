#!/usr/bin/env python
"""Triton skinny GEMM (`tokenrouter.engine.triton_gemv`) vs cuBLAS on one GPU: per kernel and per decode step.
One run, < 4 minutes on an H200.

    python studies/engine/gemv_probe.py --out OUT_DIR            # GPU
    python studies/engine/gemv_probe.py --out OUT_DIR --smoke    # tiny shapes on CPU (Triton interpreter)

(a) Kernels: for the Qwen3-0.6B / 8B / 32B layer shapes (qkv, o, gate_up, down, and down with SiLU(gate)*up
    folded in, against our SwiGLU kernel + cuBLAS) at M = 1, 2, 4, 8, 16 rows: cuBLAS (F.linear) vs our
    kernel with the config `gemv_config` picks (the engine's), and that config with PDL + L2 prefetch (how the
    engine launches it: back-to-back launches overlap). Weights rotate over copies larger than L2; each
    variant is one graph of one launch per copy, event-timed replays, median, us per call; GB/s counts weight
    + x + y bytes. Correctness on fresh random inputs, output poisoned with NaN first: max |y - ref| / max |ref|
    against a float64 matmul of the same bf16 inputs (cuBLAS's error alongside), split-K counters checked zero.
(b) Engine: graph decode step (host prep + replay / replay alone) at b = 1, 4, 8, ctx 1024 (engine width 8256
    as in perf_probe) for the three models with dummy weights, `triton_gemv` off, on, and on without the L2
    prefetch (same engine: the switch re-captures the graphs), % of the copy bandwidth measured here,
    launches per layer; correctness of off and on against our fp32 torch path on fresh prompts (perf_probe's
    scenario, teacher-forced): max relative logit error and greedy agreement. Qwen3-32B's check runs on a
    4-layer cut (its fp32 copy would not fit next to the bf16 one).
(a') A sweep of alternative tiles (FMA and tensor-core, split-K picked by the same rule) per shape and M, to
    refine the table; reported as how often and by how much the best beat the table.
Order: (b) first (its numbers decide the switch), then (a), then (a') with the time left before --deadline
(225 s); work that would end later is skipped and listed.

Writes OUT_DIR/gemv_probe.json (everything), kernels.csv, engine.csv; prints a summary (< 30 lines) last.
Every part is guarded: a failure is recorded and the run goes on. Models are loaded one at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# The working tree's package and the sibling probe scripts (perf_probe's engine helpers and scenario).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench as eb
import graph_timing as gt
import perf_probe as pp

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.engine.launch_count import count_graph_body_launches
from tokenrouter.models.spec import load_spec

MODELS = ("qwen3-0.6b", "qwen3-8b", "qwen3-32b")
OPS = ("qkv", "o", "gate_up", "down", "down_silu")
ROWS = (1, 2, 4, 8, 16)
BATCHES = (1, 4, 8)
CTX = 1024
WIDTH = pp.WIDTH  # 8256: engine_bench's max_context_len, same attention split counts as earlier runs
ROTATE_BYTES = 256e6  # weight copies per timed graph: more than L2 holds
ENGINE_SECONDS = {"qwen3-0.6b": 30, "qwen3-8b": 45, "qwen3-32b": 60}  # (b) per model, estimated: skip if no time


def op_shapes(spec) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection's weight."""
    h, q = spec.hidden_size, spec.num_heads * spec.head_dim
    kv, inter = spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h), "down": (h, inter), "down_silu": (h, inter)}


def sweep_configs(G, m: int, n: int, k: int, num_sms: int, fma_rows: int = 4) -> dict[str, Any]:
    """Alternative tiles for (a'): FMA tiles where the register tile stays small (M <= `fma_rows`; above M = 2 also
    narrower K tiles, whose [M, N, K] accumulator fits the registers), tensor-core tiles for any M (split-K by the
    table's rule for that tile)."""
    out: dict[str, Any] = {}
    if m <= fma_rows:
        fma = [(4, 1024), (8, 512), (16, 512)] if m <= 2 else [(4, 1024), (8, 512), (4, 512), (4, 256), (8, 256)]
        for bn, bk in fma:
            out[f"fma{bn}x{bk}"] = G.GemvConfig(dot=False, block_n=bn, block_k=min(bk, k), num_warps=4, num_stages=3)
    for bn, bk, st in ((64, 128, 4), (64, 256, 3), (128, 128, 3), (32, 128, 4)):
        out[f"dot{bn}x{bk}s{st}"] = G.dot_config(n, k, num_sms, block_n=bn, block_k=bk, num_stages=st)
    return out


def cfg_name(cfg) -> str:
    kind = f"dot{cfg.block_n}x{cfg.block_k}s{cfg.num_stages}" if cfg.dot else f"fma{cfg.block_n}x{cfg.block_k}"
    return kind + (f"/k{cfg.split_k}" if cfg.split_k > 1 else "")


class GemvProbe(eb.Harness):
    def __init__(self, args: argparse.Namespace) -> None:
        self.start(args, torch.cuda.is_available() and not args.smoke, "gemv_probe_")
        self.out: dict[str, Any] = {"env": eb.env_info(self.device), "errors": [], "kernels": [], "engine": [],
                                    "sweep": [], "skipped": [], "noise": []}  # fmt: skip
        # perf_probe's engine helpers: engine construction, KV page count, copy bandwidth.
        self.pp = pp.Probe(SimpleNamespace(smoke=args.smoke, out=args.out))
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.cuda else 132
        from tokenrouter.engine import triton_gemv, triton_ops

        self.G, self.T = triton_gemv, triton_ops
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.ctx = CTX if self.cuda else 40

    def models(self) -> list[str]:
        if self.args.smoke:
            return [str(self.pp.bench.tiny_dir(hf=False))]
        return self.args.models.split(",")

    def label(self, model: str) -> str:
        return "tiny" if self.args.smoke else model

    def time_us(self, body, per: int, reps: int = 25) -> float:
        """us per call: `body` (per calls) captured in one graph, median of event-timed replays (CPU smoke: wall
        clock of eager runs)."""
        if not self.cuda:
            body()
            t = time.perf_counter()
            body()
            return (time.perf_counter() - t) / per * 1e6
        return gt.capture_and_time(body, n=reps, per=per).median_us

    # ---- environment ----------------------------------------------------------------------------------------
    def environment(self) -> None:
        self.pp.environment()
        self.copy_gbps = self.pp.copy_gbps
        self.out["copy_gbps"] = self.copy_gbps
        self.out["graph_launch_us"] = self.pp.out.get("graph_launch_us")

    # ---- (a) kernels ----------------------------------------------------------------------------------------
    def kernels(self, model: str, sweep: bool) -> None:
        spec = load_spec(model)
        for op, (n, k) in op_shapes(spec).items():
            if op not in self.args.ops.split(","):
                continue
            margin = 10 if sweep else 20  # an op's kernels take a few seconds (compiles included)
            if self.elapsed() > self.args.deadline - margin:
                self.out["skipped"].append(f"{'sweep' if sweep else 'kernels'} {self.label(model)} {op}")
                continue
            self.guarded(f"kernels {self.label(model)} {op}", self.kernel_op, model, op, n, k, sweep)

    def kernel_op(self, model: str, op: str, n: int, k: int, sweep: bool) -> None:
        G, dev, dt = self.G, self.device, self.dtype
        silu = op == "down_silu"
        wbytes = n * k * torch.finfo(dt).bits // 8
        copies = max(2, math.ceil(ROTATE_BYTES / wbytes)) if self.cuda else 1
        gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{model}/{op}".encode()))
        ws = [torch.randn(n, k, device=dev, dtype=dt, generator=gen) * k**-0.5 for _ in range(copies)]
        counters = G.arrival_counters(n, dev)
        rows = tuple(int(r) for r in self.args.rows.split(",")) if self.cuda else (1, 4)
        for m in rows:
            kx = 2 * k if silu else k
            x = torch.randn(m, kx, device=dev, dtype=dt, generator=gen)
            y = torch.empty(m, n, device=dev, dtype=dt)
            io_bytes = wbytes + (m * kx + m * n) * torch.finfo(dt).bits // 8
            table = G.gemv_config(m, n, k, self.num_sms)
            base = {"model": self.label(model), "op": op, "m": m, "n": n, "k": k}

            def ours(cfg, pdl=False, x=x, y=y, preload=False):
                return lambda: [G.skinny_gemm(x, w, silu=silu, counters=counters, config=cfg, out=y, pdl=pdl,
                                              preload=preload) for w in ws]  # fmt: skip

            if sweep:
                alternatives = sweep_configs(G, m, n, k, self.num_sms, self.args.fma_rows)
                if not self.cuda:  # smoke: one tile of each kind
                    alternatives = {n_: c for n_, c in alternatives.items() if n_ in ("fma8x512", "dot64x128s4")}
                if self.args.sweep_pdl:  # the table's tile beside them, launched as the engine launches it
                    alternatives = {"table": table, **alternatives}
                for name, cfg in alternatives.items():
                    if cfg == table and name != "table":
                        continue
                    try:
                        err = self.check(x, ws[-1], silu, cfg, counters)
                        rec = {**base, "config": cfg_name(cfg) + (" (table)" if name == "table" else ""), "err": err}
                        rec["us"] = self.time_us(ours(cfg), copies)
                        if self.args.sweep_pdl and self.cuda:  # PDL, and FMA weight tiles loaded before its wait
                            rec["us_pdl"] = self.time_us(ours(cfg, pdl=True, preload=not cfg.dot), copies)
                        self.out["sweep"].append(rec)
                    except Exception as e:
                        self.error(f"sweep {self.label(model)} {op} M={m} {name}", e)
                continue
            if silu:
                xs = x[:, :k]

                def cublas(x=x):
                    return [torch.mm(self.T.silu_and_mul(x), w.t()) for w in ws] if self.cuda else [
                        torch.mm(torch.nn.functional.silu(x[:, :k]) * x[:, k:], w.t()) for w in ws]  # fmt: skip
            else:
                xs = x

                def cublas(xs=xs):
                    return [torch.mm(xs, w.t()) for w in ws]

            row = dict(base, config=cfg_name(table), bytes=io_bytes, copies=copies)
            row["cublas_us"] = self.time_us(cublas, copies)
            row["ours_us"] = self.time_us(ours(table), copies)
            row["cublas_us_2"] = self.time_us(cublas, copies)  # repeat: the noise of this measurement
            row["ours_us_2"] = self.time_us(ours(table), copies)
            if self.cuda:
                row["ours_pdl_us"] = self.time_us(ours(table, pdl=True), copies)
            row["ours_gbps"] = io_bytes / (row["ours_us"] * 1e-6) / 1e9
            row["cublas_gbps"] = io_bytes / (row["cublas_us"] * 1e-6) / 1e9
            row["err"] = self.check(x, ws[0], silu, table, counters)
            row["err_pdl"] = self.check(x, ws[0], silu, table, counters, pdl=True) if self.cuda else None
            xr = torch.randn_like(x)
            ref = self.reference(xr, ws[0], silu)
            got = torch.mm(self.T.silu_and_mul(xr) if (silu and self.cuda) else
                           (torch.nn.functional.silu(xr[:, :k]) * xr[:, k:] if silu else xr), ws[0].t())  # fmt: skip
            row["cublas_err"] = pp.rel(got, ref)
            del xs
            self.out["kernels"].append(row)
        last = [r for r in self.out["kernels"] if r["model"] == self.label(model) and r["op"] == op]
        if last:
            self.log(f"kernels {self.label(model)} {op} ({n}x{k}): " + " ".join(
                f"M{r['m']} {r['cublas_us']:.1f}/{r['ours_us']:.1f}" for r in last))  # fmt: skip

    def reference(self, x: torch.Tensor, w: torch.Tensor, silu: bool) -> torch.Tensor:
        k = w.shape[1]
        if silu:  # SiLU(gate)*up with HF's rounding points (the engine's), then a float64 matmul
            g = torch.nn.functional.silu(x[:, :k].float()).to(x.dtype).float()
            x = (g * x[:, k:].float()).to(x.dtype)
        return x.double() @ w.double().t()

    def check(self, x, w, silu, cfg, counters, pdl=False) -> float:
        """Fresh inputs, output poisoned with NaN: max rel error vs float64; counters must be back to zero."""
        xr = torch.randn_like(x)
        y = torch.full((x.shape[0], w.shape[0]), float("nan"), device=x.device, dtype=x.dtype)
        self.G.skinny_gemm(xr, w, silu=silu, counters=counters, config=cfg, out=y, pdl=pdl)
        if y.isnan().any():
            raise RuntimeError(f"{cfg_name(cfg)}: unwritten (NaN) outputs")
        if not counters.eq(0).all():
            raise RuntimeError(f"{cfg_name(cfg)}: split-K counters not reset")
        return pp.rel(y, self.reference(xr, w, silu))

    # ---- (b) engine -----------------------------------------------------------------------------------------
    def engine_model(self, model: str) -> None:
        name = self.label(model)
        spec = load_spec(model)
        eng = None
        try:
            t = time.perf_counter()
            kw: dict[str, Any] = {"load_format": "dummy", "num_pages": self.pp.pages(spec), "max_context_len": WIDTH,
                                  "graph_buckets": (1, 2, 4, 8, 16), "triton_gemv": False}  # fmt: skip
            if not self.cuda:
                kw.update(ops_backend="triton", max_context_len=512)
            eng = self.pp.engine(model, **kw)
            self.log(f"[{name}] engine ready ({time.perf_counter() - t:.1f}s) pdl={eng.pdl} "
                     f"graphs={eng.graphs_enabled}")  # fmt: skip
            full_ref = self.cuda and 2 * spec.weight_bytes < 60e9  # its fp32 copy fits next to the bf16 engine
            ref_run = self.reference_run(model, eng) if (full_ref or not self.cuda) else None
            variants = (("off", False, True), ("on", True, True), ("on_nopf", True, False))
            for vname, on, prefetch in variants if self.cuda else variants[:2]:
                if vname == "on_nopf" and self.elapsed() > self.args.deadline - 15:
                    self.out["skipped"].append(f"engine {name} {vname}")
                    continue
                if vname != "off":
                    t = time.perf_counter()
                    eng.set_triton_gemv(on, prefetch=prefetch)
                    self.log(f"[{name}] {vname}: graphs re-captured ({time.perf_counter() - t:.1f}s)")
                rec: dict[str, Any] = {"model": name, "variant": vname, "gemv": eng.gemv_enabled, "pdl": eng.pdl,
                                       "graphs": eng.graphs_enabled, "graph_error": eng.graph_error,
                                       "pdl_error": eng.pdl_error}  # fmt: skip
                rec.update(self.launches(eng))
                for b in (BATCHES if vname != "on_nopf" else (1,)) if self.cuda else (1,):
                    rec.update(self.time_decode(eng, b))
                if ref_run is not None and vname != "on_nopf":
                    rec.update(self.compare(eng, ref_run))
                self.out["engine"].append(rec)
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()
                                  if k not in ("model", "variant"))  # fmt: skip
                self.log(f"[{name}] {vname}: {shown}")
        finally:
            if eng is not None:
                eng.close()
            del eng
            self.free()
        if self.cuda and not full_ref and self.elapsed() < self.args.deadline - 15:
            self.guarded(f"correctness {name} x4", self.cut_correctness, model, 4)

    def time_decode(self, eng, b: int) -> dict[str, float]:
        """perf_probe.time_decode with fewer steps: graph step incl. host prep (best of 2 rounds), replay alone
        (device time), % of copy bandwidth of the step's bytes (weights + each row's KV read once)."""
        ctx = self.ctx
        reqs = eb.make_requests(eng, b, ctx)
        bat = Batch(0, 0, [BatchRow(r, ctx - 1, 1) for r in reqs])
        out: dict[str, float] = {}
        try:
            steps = (30 if eng.spec.num_layers > 40 else 60) if self.cuda else 1
            rounds = []
            for _ in range(2 if self.cuda else 1):
                for _ in range(3 if self.cuda else 1):
                    eng.step(bat)
                self.pp.sync()
                t = time.perf_counter()
                for _ in range(steps):
                    eng.step(bat)
                self.pp.sync()
                rounds.append((time.perf_counter() - t) / steps * 1e3)
            out[f"step_ms_b{b}"] = min(rounds)
            out[f"step_spread_b{b}"] = (max(rounds) - min(rounds)) / min(rounds)
            bucket = eng.graph_bucket_for(bat)
            if self.cuda and eng.graphs_enabled and bucket in eng.graphs.graphs:
                eng.step(bat)
                g = eng.graphs.graphs[bucket]
                out[f"replay_ms_b{b}"] = gt.time_replays(g.replay, eng.stream, n=30).median_us / 1e3
            nbytes = eng.spec.decode_weight_bytes + b * ctx * eng.spec.kv_bytes_per_token
            if self.cuda:
                out[f"pct_copy_b{b}"] = 100 * nbytes / (out[f"step_ms_b{b}"] / 1e3) / 1e9 / self.copy_gbps
        finally:
            eb.release(eng, reqs)
        return out

    def reference_run(self, model: str, eng) -> dict[str, Any]:
        """Our fp32 torch path with `eng`'s weights on perf_probe's scenario (fresh prompts, seed --seed); freed
        before returning (only its logits, on the host, are kept)."""
        ref = self.pp.engine(model, load_format="dummy", num_pages=256, max_context_len=2048, **eb.FP32_REF)
        try:
            with torch.no_grad():
                for p_ref, p in zip(ref.model.parameters(), eng.model.parameters(), strict=True):
                    p_ref.copy_(p)
            run = pp.scenario(ref, seed=self.args.seed, long_prompts=self.cuda)
            run["few"] = few_rows_scenario(ref, seed=self.args.seed, long_prompts=self.cuda)
            return run
        finally:
            ref.close()
            del ref
            self.free()

    def compare(self, eng, ref_run) -> dict[str, Any]:
        """perf_probe's scenario (4-5 rows: graph buckets 4-16) plus `few_rows_scenario` (buckets 1 and 2),
        teacher-forced by the fp32 reference: max / median rel logit error and greedy agreement over all rows."""
        run = pp.scenario(eng, seed=self.args.seed, long_prompts=self.cuda, forced=ref_run)
        few = few_rows_scenario(eng, seed=self.args.seed, long_prompts=self.cuda, forced=ref_run["few"])
        pairs = list(zip(run["logits"] + few["logits"], ref_run["logits"] + ref_run["few"]["logits"], strict=True))
        errs = [pp.rel(a, b) for (_, _, a), (_, _, b) in pairs]
        agree = [int(a.argmax()) == int(b.argmax()) for (_, _, a), (_, _, b) in pairs]
        out = {"corr_max_rel": max(errs), "corr_median_rel": statistics.median(errs),
               "corr_agree": sum(agree) / len(agree), "corr_rows": len(agree)}  # fmt: skip
        if eng.model.gemv is not None:
            out["counters_zero"] = bool(eng.model.gemv.counters.eq(0).all())
        return out

    def launches(self, eng) -> dict[str, Any]:
        """Kernels per layer of a b=1 decode graph body (launch counter) and how many are skinny GEMMs."""
        if eng.graphs is None:
            return {}
        reqs = eb.make_requests(eng, 1, 64)
        try:
            lc = count_graph_body_launches(eng, Batch(0, 0, [BatchRow(reqs[0], 63, 1)]))
            layer = lc.layer_kernels(min(1, len(lc.per_layer()) - 1))
            return {"launches_per_layer": len(layer), "skinny_per_layer": sum("skinny_gemm" in x for x in layer)}
        finally:
            eb.release(eng, reqs)

    def cut_correctness(self, model: str, layers: int) -> None:
        """`model`'s widths with `layers` layers: bf16 engine (gemv on) vs our fp32 torch path."""
        cfg = dict(load_spec(model).raw or {})
        cfg["num_hidden_layers"] = layers
        d = self.tmp / f"{model}-{layers}l"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        spec = load_spec(str(d))
        eng = self.pp.engine(str(d), load_format="dummy", num_pages=self.pp.pages(spec), max_context_len=WIDTH,
                             graph_buckets=(1, 2, 4, 8, 16), triton_gemv=True)  # fmt: skip
        try:
            ref_run = self.reference_run(str(d), eng)
            rec = {"model": f"{self.label(model)} x{layers}", "variant": "on", "gemv": eng.gemv_enabled,
                   "graphs": eng.graphs_enabled, **self.launches(eng), **self.compare(eng, ref_run)}  # fmt: skip
            eng.set_triton_gemv(False)
            off = self.compare(eng, ref_run)
            rec.update({f"off_{k}": v for k, v in off.items()})
            self.out["engine"].append(rec)
            self.log(f"[{rec['model']}] on: rel {rec['corr_max_rel']:.2e} agree {rec['corr_agree']:.0%}; "
                     f"off: rel {off['corr_max_rel']:.2e} agree {off['corr_agree']:.0%}")  # fmt: skip
        finally:
            eng.close()
            del eng
            self.free()

    # ---- output ---------------------------------------------------------------------------------------------
    def write(self) -> None:
        o = self.out
        self.write_outputs("gemv_probe.json", {"kernels.csv": o["kernels"] + o["sweep"], "engine.csv": o["engine"]})

    def summary(self) -> list[str]:
        """At most 29 lines (3 models): header, 15 kernel lines, sweep, 7 engine lines, 3 error lines."""
        o, env = self.out, self.out["env"]
        ks = o["kernels"]
        noise = [abs(r[a] - r[b]) / min(r[a], r[b]) for r in ks for a, b in (("cublas_us", "cublas_us_2"),
                 ("ours_us", "ours_us_2"))]  # fmt: skip
        skipped = f" | skipped {len(o['skipped'])} (time budget, see json)" if o["skipped"] else ""
        spread = statistics.median(noise) if noise else 0.0
        L = [f"GEMV PROBE {env['device']} torch {env['torch']} triton {env['triton']} | copy "
             f"{o.get('copy_gbps', 0):.0f} GB/s | repeat spread median {spread:.1%} | {self.elapsed():.0f} s"
             f"{skipped}"]  # fmt: skip
        L.append("[a] us/call cuBLAS/ours (table config) per M | ours GB/s M1,M8 | max rel err ours/cuBLAS | "
                 "ours+PDL+prefetch us M1,M8")  # fmt: skip
        for model in dict.fromkeys(r["model"] for r in ks):
            for op in OPS:
                rs = {r["m"]: r for r in ks if r["model"] == model and r["op"] == op}
                if not rs:
                    continue
                cells = " ".join(f"M{m} {r['cublas_us']:.1f}/{r['ours_us']:.1f}" for m, r in rs.items())
                gb = ",".join(f"{rs[m]['ours_gbps']:.0f}" for m in (1, 8) if m in rs)
                err = f"{max(r['err'] for r in rs.values()):.0e}/{max(r['cublas_err'] for r in rs.values()):.0e}"
                pdl = ",".join(f"{rs[m]['ours_pdl_us']:.1f}" for m in (1, 8) if m in rs and "ours_pdl_us" in rs[m])
                L.append(f"  {model[:10]:10s} {op:9s} {cells} | {gb} | {err} | {pdl}"[:170])
        if o["sweep"]:
            wins, gains = 0, []
            cases = {(r["model"], r["op"], r["m"]): r for r in ks}
            best: dict[tuple, dict] = {}
            for s in o["sweep"]:
                key = (s["model"], s["op"], s["m"])
                if key in cases and (key not in best or s["us"] < best[key]["us"]):
                    best[key] = s
            for key, s in best.items():
                gain = cases[key]["ours_us"] / s["us"] - 1
                gains.append(gain)
                wins += gain > 0.03
            top = sorted(best.items(), key=lambda kv: cases[kv[0]]["ours_us"] / kv[1]["us"], reverse=True)[:2]
            L.append((f"[a'] sweep: {len(best)} cases, a sweep tile beat the table by >3% in {wins}, median gain "
                      f"{statistics.median(gains) if gains else 0:+.1%}; top: " + "; ".join(
                          f"{k[0].removeprefix('qwen3-')} {k[1]} M{k[2]} {s['config']} {s['us']:.1f} vs "
                          f"{cases[k]['ours_us']:.1f}" for k, s in top))[:170])  # fmt: skip
            L += pdl_sweep_lines(o["sweep"])
        L.append(f"[b] decode ms (graph step/replay) ctx {CTX} | %copy b1 | launches/layer (skinny) | corr vs fp32 "
                 f"| on without L2 prefetch b1")  # fmt: skip
        nopf = {r["model"]: r for r in o["engine"] if r["variant"] == "on_nopf"}
        for r in o["engine"]:
            if r["variant"] == "on_nopf":
                continue
            cells = " ".join(
                f"b{b} {r[f'step_ms_b{b}']:.3f}/{r.get(f'replay_ms_b{b}', float('nan')):.3f}"
                for b in BATCHES if f"step_ms_b{b}" in r
            )  # fmt: skip
            pct = f"{r['pct_copy_b1']:.0f}%" if "pct_copy_b1" in r else "-"
            corr = f"rel {r['corr_max_rel']:.1e} agree {r['corr_agree']:.0%}" if "corr_max_rel" in r else ""
            if "off_corr_max_rel" in r:
                corr += f" (off: {r['off_corr_max_rel']:.1e} {r['off_corr_agree']:.0%})"
            flags = "" if r.get("graphs", True) else " NO-GRAPHS"
            flags += " PDL-OFF" if r.get("pdl_error") else ""
            flags += " COUNTERS!" if r.get("counters_zero") is False else ""
            if r["variant"] == "on" and "step_ms_b1" in nopf.get(r["model"], {}):
                flags += f" | nopf b1 {nopf[r['model']]['step_ms_b1']:.3f}"
            launches = f"{r.get('launches_per_layer', '-')}({r.get('skinny_per_layer', '-')})"
            L.append(f"  {r['model'][:13]:13s} {r['variant']:3s} {cells} {pct:>4s} {launches} {corr}{flags}"[:170])
        for e in o["errors"][:2]:
            L.append(f"  ! {e[:160]}")
        if len(o["errors"]) > 2:
            L.append(f"  ! ... {len(o['errors']) - 2} more errors in gemv_probe.json")
        return L


def pdl_sweep_lines(sweep: list[dict[str, Any]]) -> list[str]:
    """--sweep-pdl: per (model, op, M), the table's tile against the fastest tile, both launched with PDL."""
    by: dict[tuple, list[dict]] = {}
    for s in sweep:
        if s.get("us_pdl") is not None:
            by.setdefault((s["model"], s["op"], s["m"]), []).append(s)
    lines = []
    for (model, op, m), rs in by.items():
        table = next((r for r in rs if r["config"].endswith("(table)")), None)
        best = min(rs, key=lambda r: r["us_pdl"])
        t = f"{table['us_pdl']:.2f}" if table else "-"
        lines.append(f"  [a' pdl] {model.removeprefix('qwen3-')} {op} M{m}: table {t} us, best {best['config']} "
                     f"{best['us_pdl']:.2f} us")  # fmt: skip
    return lines


def few_rows_scenario(eng, seed: int, long_prompts: bool, forced: dict | None = None) -> dict[str, Any]:
    """Decode steps of one and two rows (graph buckets 1 and 2: the FMA path), which perf_probe's scenario never
    has: two prompts prefilled (eager), 4 decodes of the first alone, 4 of both. Tokens appended after each step
    are `forced`'s (a reference run's) or the engine's greedy picks."""
    g = torch.Generator().manual_seed(seed + 1)
    vocab = eng.spec.vocab_size
    lens = [700, 90] if long_prompts else [11, 6]
    prompts = {f"s{i}": torch.randint(0, vocab, (n,), generator=g).tolist() for i, n in enumerate(lens)}
    plan = [[("s0", None), ("s1", None)]] + [[("s0", 1)]] * 4 + [[("s0", 1), ("s1", 1)]] * 4
    return eb.run_plan(eng, prompts, [[(rid, n, []) for rid, n in step] for step in plan], forced, "few-rows")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (JSON + CSV)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU with the Triton interpreter")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--seed", type=int, default=11, help="prompt seed of the engine correctness scenario")
    p.add_argument("--deadline", type=float, default=225.0,
                   help="s; work that would end after this is skipped (and listed)")  # fmt: skip
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-engine", action="store_true", help="no (b): kernels and sweep only")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values of (a) and (a')")
    p.add_argument("--fma-rows", type=int, default=4, help="(a'): FMA tiles up to this M")
    p.add_argument(
        "--sweep-pdl",
        action="store_true",
        help="(a'): also time each tile with PDL (+ FMA weight pre-load), the table's tile included",
    )
    args = p.parse_args(argv)
    if args.smoke and args.ops == ",".join(OPS):
        args.ops = "qkv,down_silu"
    if args.smoke or not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") != "1":  # triton.language must be imported in interpreter mode
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "TRITON_INTERPRET": "1"})
        from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

        patch_interpreter_for_numpy24()
    probe = GemvProbe(args)
    print(f"gemv probe on {probe.out['env']}", flush=True)
    probe.guarded("environment", probe.environment)
    if not hasattr(probe, "copy_gbps"):
        probe.copy_gbps = probe.pp.copy_gbps = float("nan")
    # (b) first: the engine numbers decide the switch; then (a) and, with the time left, (a').
    for model in probe.models():
        est = ENGINE_SECONDS.get(model, 30) if probe.cuda else 0
        if args.skip_engine or probe.elapsed() + est > args.deadline:
            probe.out["skipped"].append(f"engine {probe.label(model)}")
            continue
        probe.guarded(f"engine {model}", probe.engine_model, model)
    for model in probe.models():
        probe.guarded(f"kernels {model}", probe.kernels, model, False)
    if not args.skip_sweep:
        for model in probe.models():
            probe.guarded(f"sweep {model}", probe.kernels, model, True)
    probe.guarded("write", probe.write)
    try:
        lines = probe.summary()
    except Exception as e:  # the numbers are in the JSON; say why the table is missing
        lines = [f"summary failed: {type(e).__name__}: {e}"]
    print("=" * 120)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
