#!/usr/bin/env python
"""Where a graph decode step's time goes (issue 24): kernel count and time per kernel class, alone and co-located.

    python studies/engine/step_profile.py profile --out OUT_DIR   # one H200: ~2-3 min
    python studies/engine/step_profile.py coloc --out OUT_DIR     # MPS co-location + client priority: ~2-3 min
    python studies/engine/step_profile.py profile --out OUT_DIR --smoke   # CPU, checks the script

profile: for each case (model, batch, context, switches) build an engine with dummy weights, time the step as a
loop sees it (back to back, and waiting on each step's result) and the graph replay alone, then torch.profiler
over 20 replays: per kernel class (gemm, lm_head, attention, norm, rope_store, act, sample, prologue, argmax,
copy, other) the kernel count and summed duration per step, busy (sum) vs span (first start to last end), and
the floor: weight + KV bytes over the measured copy bandwidth. With PDL a kernel's duration includes its wait
for the predecessor, so the `no_pdl` case gives the clean per-class durations.

coloc: starts a private MPS daemon, then for each arrangement two worker processes (Qwen3-32B decode b=8 in a
loop; Qwen3-0.6B measuring b=1 and b=8 steps alone, then beside the 32B loop), with CUDA_MPS_CLIENT_PRIORITY
set per worker (0 normal, 1 below normal; unset = the driver's default). Each worker reports median step times;
the 32B reports its steps alone and while the small model measures. Stops the daemon at the end.

Writes OUT_DIR/step_profile.json / coloc.json, kernels_<case>.csv, and prints a summary last.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench as eb
import graph_timing as gt
import perf_probe as pp

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.runner import Engine

WIDTH = 8256  # block-table width of the engines (engine_bench's): fixes the decode split count
CLASSES = ("gemm", "lm_head", "attention", "attn_reduce", "norm", "rope_store", "act", "sample", "prologue",
           "argmax", "gather", "copy", "other")  # fmt: skip
# (label, model, batch, context, engine switches)
CASES = [
    ("0.6b_b1_ctx1k", "qwen3-0.6b", 1, 1024, {}),
    ("0.6b_b1_ctx1k_nopdl", "qwen3-0.6b", 1, 1024, {"triton_pdl": False}),
    ("0.6b_b8_ctx1k", "qwen3-0.6b", 8, 1024, {}),
    ("0.6b_b1_ctx8k", "qwen3-0.6b", 1, 8192, {}),
    ("0.6b_b8_ctx8k", "qwen3-0.6b", 8, 8192, {}),
    ("32b_b8_ctx1k", "qwen3-32b", 8, 1024, {}),
    ("32b_b8_ctx1k_nopdl", "qwen3-32b", 8, 1024, {"triton_pdl": False}),
]
# Decode attention with the engine's earlier tile config (64 keys, 4 warps, 2 stages) for the A/B of the change.
OLD_DECODE = {"_decode_config": (64, 4, 2)}
AB_CASES = [
    ("0.6b_b1_ctx1k_olddec", "qwen3-0.6b", 1, 1024, OLD_DECODE),
    ("0.6b_b8_ctx1k_olddec", "qwen3-0.6b", 8, 1024, OLD_DECODE),
    ("0.6b_b1_ctx8k_olddec", "qwen3-0.6b", 1, 8192, OLD_DECODE),
    ("0.6b_b8_ctx8k_olddec", "qwen3-0.6b", 8, 8192, OLD_DECODE),
    ("32b_b8_ctx1k_olddec", "qwen3-32b", 8, 1024, OLD_DECODE),
]


def restore_decode_config(prev: tuple | None) -> None:
    """Undo `set_decode_config` (None: the engine's own choice by split length)."""
    from tokenrouter.engine.attention import triton_decode

    if prev is None:
        triton_decode.decode_attention_triton.__kwdefaults__["config"] = None
    else:
        set_decode_config(*prev)


def set_decode_config(block_n: int, num_warps: int, num_stages: int) -> tuple:
    """Make the decode attention launch with this tile config (what engines capture from now on); returns the
    previous one as (block_n, num_warps, num_stages)."""
    from tokenrouter.engine.attention import triton_decode
    from tokenrouter.engine.attention.triton_common import KernelConfig

    kw = triton_decode.decode_attention_triton.__kwdefaults__
    old = kw["config"]
    kw["config"] = KernelConfig(block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    return None if old is None else (old.block_n, old.num_warps, old.num_stages)


SMOKE_CASES = [("tiny_b1", "tiny-small", 1, 40, {}), ("tiny_b4", "tiny-small", 4, 40, {})]


def kernel_class(name: str) -> str:
    n = name.lower()
    if "sample_kernel" in n:
        return "sample"
    if "prologue" in n:
        return "prologue"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return pp.category(name)


def classify(kernels: list[dict], num_layers: int) -> dict[str, Any]:
    """Per class: count and us per step; the last GEMM after the final norm is the LM head."""
    for k in kernels:
        k["cls"] = kernel_class(k["name"])
    norms = [i for i, k in enumerate(kernels) if k["cls"] == "norm"]
    if norms:
        for k in kernels[norms[-1] :]:
            if k["cls"] == "gemm":
                k["cls"] = "lm_head"
    per: dict[str, dict[str, float]] = {c: {"count": 0, "us": 0.0} for c in CLASSES}
    for k in kernels:
        per[k["cls"]]["count"] += 1
        per[k["cls"]]["us"] += k["dur"]
    busy = sum(k["dur"] for k in kernels)
    span = max(k["off"] + k["dur"] for k in kernels) - min(k["off"] for k in kernels) if kernels else 0.0
    return {"classes": per, "kernels": len(kernels), "busy_us": busy, "span_us": span,
            "kernels_per_layer": (len(kernels) - sum(1 for k in kernels if k["cls"] in ("lm_head", "sample", "prologue",
                                  "argmax", "copy"))) / max(num_layers, 1)}  # fmt: skip


class Profiler(eb.Harness):
    def __init__(self, args: argparse.Namespace) -> None:
        self.start(args, torch.cuda.is_available() and not args.smoke, "step_profile_")
        self.out: dict[str, Any] = {"env": eb.env_info(self.device), "errors": [], "cases": []}
        self.bench = eb.Bench(argparse.Namespace(cpu=not self.cuda))

    def engine(self, model: str, **kw: Any) -> Engine:
        return super().engine(model, **{"load_format": "dummy", "varlen_graphs": False, "warmup": False, **kw})

    def run(self) -> None:
        self.bench.copy_bandwidth()
        self.out["copy_gbps"] = self.copy_gbps = self.bench.copy_gbps
        cases = SMOKE_CASES if not self.cuda else CASES + AB_CASES
        if self.args.cases:
            cases = [c for c in cases if c[0] in self.args.cases.split(",")]
        eng, key = None, None
        for label, model, b, ctx, sw in cases:
            if self.elapsed() > self.args.budget:
                self.out["errors"].append(f"{label}: skipped (time budget)")
                continue
            try:
                k = (model, tuple(sorted(sw.items())))
                if k != key:
                    if eng is not None:
                        eng.close()
                    eng = None
                    self.free()
                    t = time.perf_counter()
                    pages = 8 * (8192 // 16) + WIDTH // 16 + 64 if self.cuda else 200
                    eng = self.engine(model, num_pages=pages, max_context_len=WIDTH if self.cuda else 64,
                                      graph_buckets=(1, 8), **{a: v for a, v in sw.items() if a[0] != "_"})  # fmt: skip
                    key = k
                    if "_decode_config" in sw:
                        prev = set_decode_config(*sw["_decode_config"])
                        eng.recapture()
                        restore_decode_config(prev)
                    self.log(f"{label}: engine built in {time.perf_counter() - t:.1f}s pdl={eng.pdl}")
                rec = {"case": label, "model": model, "batch": b, "ctx": ctx, **sw}
                rec.update(self.measure(eng, label, b, ctx))
                self.out["cases"].append(rec)
                self.log(f"{label}: step {rec.get('step_ms', 0):.3f} ms, replay {rec.get('replay_ms', 0):.3f} ms, "
                         f"floor {rec.get('floor_ms', 0):.3f} ms, kernels {rec.get('kernels')}")  # fmt: skip
            except Exception as e:
                self.error(label, e)
        if eng is not None:
            eng.close()

    def measure(self, eng: Engine, label: str, b: int, ctx: int) -> dict[str, Any]:
        reqs = eb.make_requests(eng, b, ctx)
        bat = Batch(0, 0, [BatchRow(r, ctx - 1, 1) for r in reqs])
        out: dict[str, Any] = {}
        try:
            n = (40 if eng.spec.num_layers > 30 else 150) if self.cuda else 2
            for wait in (False, True):
                rounds = []
                for _ in range(2):
                    for _ in range(3):
                        eng.step(bat).result()
                    self.sync()
                    t = time.perf_counter()
                    for _ in range(n):
                        h = eng.step(bat)
                        if wait:
                            h.result()
                    self.sync()
                    rounds.append((time.perf_counter() - t) / n * 1e3)
                out["step_wait_ms" if wait else "step_ms"] = min(rounds)
            spec = eng.spec
            nbytes = spec.decode_weight_bytes + b * ctx * spec.kv_bytes_per_token
            out["bytes"] = nbytes
            if not self.cuda:
                return out
            out["floor_ms"] = nbytes / (self.copy_gbps * 1e9) * 1e3
            bucket = eng.graph_bucket_for(bat)
            g = eng.graphs.graphs[bucket]
            eng.step(bat).result()
            out["replay_ms"] = gt.time_replays(g.replay, eng.stream, n=40).median_us / 1e3
            kernels, _ = pp.profile_graph(g, eng.stream, 20, self.tmp)
            res = classify(kernels, spec.num_layers)
            out.update({k: v for k, v in res.items() if k != "classes"})
            out["classes"] = res["classes"]
            self.write_kernels(label, kernels)
        finally:
            eb.release(eng, reqs)
        return out

    def write_kernels(self, label: str, kernels: list[dict]) -> None:
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"kernels_{label}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["pos", "class", "dur_us", "start_us", "name"])
            for i, k in enumerate(kernels):
                w.writerow([i, k["cls"], f"{k['dur']:.3f}", f"{k['off']:.3f}", k["name"][:120]])

    def summary(self) -> list[str]:
        lines = [f"STEP PROFILE {self.out['env'].get('gpu', '')} copy {self.copy_gbps:.0f} GB/s"]
        short = ("gemm", "lm_head", "attention", "norm", "rope_store", "act", "sample", "argmax", "prologue", "copy",
                 "other")  # fmt: skip
        lines.append("case                 step/wait/replay/floor ms   kern  busy/span us | class count:us ...")
        for r in self.out["cases"]:
            cl = r.get("classes", {})
            parts = " ".join(f"{c[:4]}{cl[c]['count']}:{cl[c]['us']:.0f}" for c in short if cl.get(c, {}).get("count"))
            lines.append(f"{r['case']:20s} {r.get('step_ms', 0):.3f}/{r.get('step_wait_ms', 0):.3f}/"
                         f"{r.get('replay_ms', 0):.3f}/{r.get('floor_ms', 0):.3f} {r.get('kernels', 0):5d} "
                         f"{r.get('busy_us', 0):.0f}/{r.get('span_us', 0):.0f} | {parts}")  # fmt: skip
        lines += [f"ERROR {e}" for e in self.out["errors"]]
        return lines


# ---- co-location under MPS --------------------------------------------------------------------------------------
ARRANGEMENTS = {  # name: (large client's priority, small client's priority); None = variable unset
    "default": (None, None),
    "large_below": ("1", "0"),
    "small_below": ("0", "1"),
}


def wait_for(path: Path, timeout: float) -> None:
    t = time.time()
    while not path.exists():
        if time.time() - t > timeout:
            raise TimeoutError(f"no {path.name} after {timeout:.0f}s")
        time.sleep(0.02)


def worker(args: argparse.Namespace) -> int:
    """One co-location client: `large` loops Qwen3-32B b=8 steps, `small` measures Qwen3-0.6B b=1/8."""
    sync = Path(args.sync)
    large, small = args.models.split(",")
    model = large if args.role == "large" else small
    cpu = {} if torch.cuda.is_available() else {"graph_emulation": True, "dtype": "float32"}
    eng = Engine(EngineConfig(model=model, load_format="dummy", num_pages=8 * 64 + WIDTH // 16 + 64,
                              max_context_len=WIDTH if not cpu else 1100, graph_buckets=(1, 8), varlen_graphs=False,
                              warmup=False, **cpu))  # fmt: skip
    res: dict[str, Any] = {"role": args.role, "priority": os.environ.get("CUDA_MPS_CLIENT_PRIORITY")}
    batches = {b: Batch(0, 0, [BatchRow(r, 1023, 1) for r in eb.make_requests(eng, b, 1024)]) for b in (1, 8)}

    def steps(bat: Batch, n: int) -> list[float]:
        ts = []
        eng.step(bat).result()
        t = time.perf_counter()
        for _ in range(n):
            eng.step(bat).result()
            t2 = time.perf_counter()
            ts.append((t2 - t) * 1e3)
            t = t2
        return ts

    (sync / f"{args.role}_ready").touch()
    if args.role == "large":
        wait_for(sync / "large_go", 300)
        alone, corun = [], []
        bat = batches[8]
        eng.step(bat).result()
        t = time.perf_counter()
        while not (sync / "stop").exists():
            eng.step(bat).result()
            t2 = time.perf_counter()
            (corun if (sync / "small_corun").exists() else alone).append((t2 - t) * 1e3)
            t = t2
            if len(alone) == 30:
                (sync / "large_running").touch()
        res.update(alone_b8_ms=statistics.median(alone), corun_b8_ms=statistics.median(corun) if corun else None,
                   corun_steps=len(corun))  # fmt: skip
    else:
        wait_for(sync / "large_ready", 300)
        for b in (1, 8):
            res[f"alone_b{b}_ms"] = statistics.median(steps(batches[b], 200))
        (sync / "large_go").touch()
        wait_for(sync / "large_running", 60)
        (sync / "small_corun").touch()
        for b in (1, 8):
            ts = steps(batches[b], 300)
            res[f"corun_b{b}_ms"] = statistics.median(ts)
            res[f"corun_b{b}_p90_ms"] = sorted(ts)[int(0.9 * len(ts))]
        (sync / "stop").touch()
    (sync / f"{args.role}.json").write_text(json.dumps(res))
    eng.close()
    return 0


def coloc(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(args.tmp or "/tmp") / "tr_mps"
    shutil.rmtree(base, ignore_errors=True)
    mps = {"CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(base / "log")}
    for d in mps.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    env0 = {**os.environ, **mps}
    results: dict[str, Any] = {"arrangements": {}, "errors": []}
    ctl = os.environ.get("MPS_CONTROL", "nvidia-cuda-mps-control")
    subprocess.run([ctl, "-d"], env=env0, check=True, timeout=30)
    t0 = time.time()
    try:
        for name in (args.arrangements or ",".join(ARRANGEMENTS)).split(","):
            if time.time() - t0 > args.budget:
                results["errors"].append(f"{name}: skipped (time budget)")
                continue
            sync = base / f"sync_{name}"
            sync.mkdir(parents=True)
            procs = {}
            for role, prio in zip(("large", "small"), ARRANGEMENTS[name], strict=True):
                env = dict(env0)
                env.pop("CUDA_MPS_CLIENT_PRIORITY", None)
                if prio is not None:
                    env["CUDA_MPS_CLIENT_PRIORITY"] = prio
                cmd = [sys.executable, __file__, "worker", "--role", role, "--sync", str(sync), "--out", str(out),
                       "--models", args.models]  # fmt: skip
                with open(out / f"coloc_{name}_{role}.log", "w") as log:
                    procs[role] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                for p in procs.values():
                    p.wait(timeout=240)
                rec = {role: json.loads((sync / f"{role}.json").read_text()) for role in procs}
                results["arrangements"][name] = rec
                print(f"[{time.time() - t0:5.0f}s] {name}: {json.dumps(rec)}", flush=True)
            except Exception as e:
                results["errors"].append(f"{name}: {type(e).__name__}: {e}")
                (sync / "stop").touch()
                for p in procs.values():
                    if p.poll() is None:
                        p.kill()
    finally:
        subprocess.run([ctl], input=b"quit\n", env=env0, timeout=30, check=False)
        for f in (base / "log").glob("*.log"):
            shutil.copy(f, out / f"mps_{f.name}")
    (out / "coloc.json").write_text(json.dumps(results, indent=1))
    print("COLOC (ms, median; small = Qwen3-0.6B, large = Qwen3-32B b=8, ctx 1k)")
    for name, rec in results["arrangements"].items():
        s, lg = rec["small"], rec["large"]
        print(f"  {name:12s} small b1 {s['alone_b1_ms']:.3f}->{s['corun_b1_ms']:.3f} (p90 {s['corun_b1_p90_ms']:.3f}) "
              f"b8 {s['alone_b8_ms']:.3f}->{s['corun_b8_ms']:.3f} | large b8 {lg['alone_b8_ms']:.2f}->"
              f"{lg['corun_b8_ms'] or float('nan'):.2f} ({lg['corun_steps']} steps)")  # fmt: skip
    for e in results["errors"]:
        print("ERROR", e)
    return 0


# ---- greedy equality of an engine change on the GPU ---------------------------------------------------------------
def greedy_run(eng: Engine, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """Prefill every prompt in one step, then `steps` graph decode steps of all rows; (tokens per row, logits of
    the first decode step)."""
    from tokenrouter.core.request import Request

    reqs = [Request(f"g{i}", list(p), len(p)) for i, p in enumerate(prompts)]
    for r in reqs:
        assert eng.kv_pool.grow(r.pages, len(r.token_ids) + steps + 1)
    rows = [BatchRow(r, 0, len(r.token_ids)) for r in reqs]
    first = None
    try:
        for i in range(steps + 1):
            res = eng.step(Batch(0, i, rows), return_logits=i == 1).result()
            if i == 1:
                first = res.logits.float().clone()
            for row, tok in zip(rows, res.next_token_ids.tolist(), strict=True):
                row.req.num_computed = row.start + row.num_tokens
                row.req.token_ids.append(tok)
            rows = [BatchRow(r, r.num_computed, 1) for r in reqs]
    finally:
        eb.release(eng, reqs)
    return [r.token_ids[r.prompt_len :] for r in reqs], first


def compare(a: tuple[list[list[int]], torch.Tensor], b: tuple[list[list[int]], torch.Tensor]) -> dict[str, Any]:
    (ta, la), (tb, lb) = a, b
    div = [
        next((i for i, (x, y) in enumerate(zip(p, q, strict=True)) if x != y), None)
        for p, q in zip(ta, tb, strict=True)
    ]
    return {"rows_identical": sum(d is None for d in div), "first_divergence": div,
            "first_step_logit_rel": float((la - lb).abs().max() / lb.abs().max()),
            "first_step_argmax_equal": bool((la.argmax(-1) == lb.argmax(-1)).all())}  # fmt: skip


def greedy(args: argparse.Namespace) -> int:
    """Greedy decode of the same prompts at b = 1 and 8 with the decode attention config of the engine (twice:
    the run-to-run control) and with the earlier one (graphs recaptured in between): identical tokens?"""
    out: dict[str, Any] = {"rows": []}
    cpu = {} if torch.cuda.is_available() else {"graph_emulation": True, "dtype": "float32"}
    new = (64, 2, 1)  # the short-split tile, against the pipelined one, on every decode
    engine_default = set_decode_config(*new)
    for model in args.models.split(","):
        eng = Engine(EngineConfig(model=model, load_format="dummy", num_pages=8 * 80 + WIDTH // 16 + 64,
                                  max_context_len=WIDTH, graph_buckets=(1, 8), varlen_graphs=False, warmup=False,
                                  **cpu))  # fmt: skip
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(0, eng.spec.vocab_size, (int(n),), generator=g).tolist()
                   for n in torch.randint(100, 900, (8,), generator=g)]  # fmt: skip
        for b in (1, 8):
            runs = {}
            for name, cfg in (("new", new), ("new_again", new), ("old", (64, 4, 2))):
                set_decode_config(*cfg)
                eng.recapture()
                runs[name] = greedy_run(eng, prompts[:b], args.steps)
            for other in ("new_again", "old"):
                row = {"model": model, "batch": b, "steps": args.steps, "a": "new", "b": other,
                       **compare(runs["new"], runs[other])}  # fmt: skip
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
        eng.close()
        del eng
        if cpu == {}:
            torch.cuda.empty_cache()
    restore_decode_config(engine_default)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "greedy.json").write_text(json.dumps(out, indent=1))
    return 0


# ---- decode attention configs ------------------------------------------------------------------------------------
ATTN_SHAPES = [  # (label, Hq, Hkv, batch, context, cache copies rotated so the KV never sits in L2)
    ("0.6b_b1_ctx1k", 16, 8, 1, 1024, 24),
    ("0.6b_b8_ctx1k", 16, 8, 8, 1024, 8),
    ("0.6b_b1_ctx8k", 16, 8, 1, 8192, 8),
    ("32b_b8_ctx1k", 64, 8, 8, 1024, 8),
    ("32b_b1_ctx1k", 64, 8, 1, 1024, 24),
    ("0.6b_b8_ctx8k", 16, 8, 8, 8192, 2),
]


SWEEP_TILES = [(64, 2, 1), (64, 2, 2), (64, 4, 1), (64, 4, 2), (32, 2, 1), (128, 4, 1), (128, 4, 2)]


def attn_shape(label: str, hq: int, hkv: int, b: int, ctx: int, copies: int, deadline: float) -> list[dict]:
    """One shape of `attn_sweep`: every config timed over `copies` KV caches in one graph."""
    from tokenrouter.engine.attention import split_counters
    from tokenrouter.engine.attention.triton_common import KernelConfig, decode_config
    from tokenrouter.engine.attention.triton_decode import decode_attention_triton, decode_num_splits

    dev, page, d, bf = torch.device("cuda"), 16, 128, torch.bfloat16
    width, per_row = WIDTH // page, ctx // page
    n_pages = b * per_row + 1
    caches = [(torch.randn(n_pages, page, hkv, d, device=dev, dtype=bf),
               torch.randn(n_pages, page, hkv, d, device=dev, dtype=bf)) for _ in range(copies)]  # fmt: skip
    bt = torch.zeros(b, width, dtype=torch.int32, device=dev)
    bt[:, :per_row] = (torch.randperm(n_pages - 1, device=dev)[: b * per_row].int() + 1).view(b, per_row)
    sl = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(b, hq, d, device=dev, dtype=bf)
    out = torch.empty_like(q)
    ctr = split_counters(b, hkv, dev)
    default = decode_num_splits(b, hkv, width, page, dev)
    ref = decode_attention_triton(q, *caches[0], bt, sl, d**-0.5, counters=ctr).float()
    configs = [(decode_config(default, width * page), default)]  # the engine's choice first
    for bn, nw, ns in SWEEP_TILES:
        for sp in sorted({default, max(1, default // 2)}):
            c = (KernelConfig(block_n=bn, num_warps=nw, num_stages=ns), sp)
            if c != configs[0]:
                configs.append(c)

    def call(kc, vc, cfg, sp):
        decode_attention_triton(q, kc, vc, bt, sl, d**-0.5, out=out, num_splits=sp, config=cfg, counters=ctr)

    rows: list[dict[str, Any]] = []
    for cfg, sp in configs:
        rec = {"shape": label, "block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
               "splits": sp, "default": (cfg, sp) == configs[0]}  # fmt: skip
        if time.perf_counter() > deadline:
            rows.append({**rec, "skipped": True})
            continue
        try:
            us = gt.capture_and_time(lambda cfg=cfg, sp=sp: [call(kc, vc, cfg, sp) for kc, vc in caches], n=20,
                                     per=copies).median_us  # fmt: skip
            call(*caches[0], cfg, sp)
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            rows.append({**rec, "us": us, "err": err, "kv_gbps": 2 * b * ctx * hkv * d * 2 / us / 1e3})
        except Exception as e:
            rows.append({**rec, "error": f"{type(e).__name__}: {e}"[:200]})
    return rows


def attn_sweep(args: argparse.Namespace) -> int:
    """us per decode attention call (block-table width WIDTH, page 16, head dim 128, fused merge) for tile, warp,
    stage and split choices against the engine's; each checked against the default config's output."""
    deadline = time.perf_counter() + args.budget
    rows: list[dict[str, Any]] = []
    for shape in ATTN_SHAPES:
        try:
            rows += attn_shape(*shape, deadline)
        except Exception as e:
            print(f"ERROR {shape[0]}: {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "attn_sweep.json").write_text(json.dumps(rows, indent=1))
    print("ATTN SWEEP (us per call; default -> best [block_n/warps/stages/splits], err of best)")
    for label, *_ in ATTN_SHAPES:
        ok = [r for r in rows if r["shape"] == label and "us" in r and r["err"] < 2e-2]
        base = next((r for r in ok if r["default"]), None)
        if base is None:
            print(f"  {label}: no result")
            continue
        best = min(ok, key=lambda r: r["us"])
        tile = f"{best['block_n']}/{best['num_warps']}/{best['num_stages']}/{best['splits']}"
        print(f"  {label:14s} {base['us']:6.2f} ({base['kv_gbps']:.0f} GB/s) -> {best['us']:6.2f} [{tile}] "
              f"err {best['err']:.1e} (default splits {base['splits']})")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("profile", "coloc", "worker", "greedy", "attn"))
    p.add_argument("--steps", type=int, default=48, help="greedy: decode steps per run")
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--cases", default="", help="comma list of case labels (default: all)")
    p.add_argument("--arrangements", default="", help=f"comma list of {', '.join(ARRANGEMENTS)}")
    p.add_argument("--budget", type=float, default=240.0, help="seconds; later cases are skipped")
    p.add_argument("--tmp", default="")
    p.add_argument("--role", choices=("large", "small"))
    p.add_argument("--sync", default="")
    p.add_argument("--models", default="qwen3-32b,qwen3-0.6b", help="coloc: large,small; greedy: the models")
    args = p.parse_args(argv)
    if args.mode == "worker":
        return worker(args)
    if args.mode == "coloc":
        return coloc(args)
    if args.mode == "greedy":
        return greedy(args)
    if args.mode == "attn":
        return attn_sweep(args)
    prof = Profiler(args)
    prof.run()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "step_profile.json").write_text(json.dumps(prof.out, indent=1, default=str))
    print("\n".join(prof.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
