"""Analytic profile: bytes over bandwidth + FLOPs over peak + kernel/launch overhead, from `ModelSpec` shapes.
`python -m tokenrouter.calibration.analytic` regenerates the bundled H200 file; each coefficient's formula and the
assumptions: docs/calibration.md#the-analytic-profile.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from functools import cache
from itertools import pairwise
from pathlib import Path

from tokenrouter.models.spec import ModelSpec, bundled_model_names, load_spec

from .assumptions import Assumptions
from .profile import (
    SCHEMA_VERSION,
    GpuInfo,
    LinkInfo,
    ModelProfile,
    MpsInfo,
    Profile,
    StdServingInfo,
    StepCoeffs,
    StepModes,
)

H200 = GpuInfo(name="NVIDIA H200", mem_bw_gbs=4255.0, matmul_tflops=790.0, memory_gb=141.0)
H200_CREATED = "2026-11-29"  # the date of the H200 measurements it uses (studies/calibration/README.md)
# Weight streaming measured on the H200 (GB/s) at these models' MLP shapes, and the copy ceiling of that machine
# (studies/calibration/README.md, Reference H200 measurements).
MEASURED_STREAM_GBS: dict[str, float] = {"qwen3-0.6b": 1722.0, "qwen3-8b": 3947.0, "qwen3-32b": 4185.0}
MEASURED_COPY_GBS = 4255.0
ASSUMPTIONS = Assumptions()  # the defaults, as the bundled profile is generated


def _r(x: float) -> float:
    """Six significant digits: readable JSON, and deterministic across platforms."""
    return float(f"{x:.6g}")


@cache
def _efficiency_points() -> tuple[tuple[int, float], ...]:
    return tuple(sorted((load_spec(n).num_params, g / MEASURED_COPY_GBS) for n, g in MEASURED_STREAM_GBS.items()))


def stream_efficiency(num_params: int) -> float:
    """Measured weight-streaming bandwidth / copy bandwidth, log-interpolated in parameter count."""
    pts = _efficiency_points()
    if num_params <= pts[0][0]:
        return pts[0][1]
    for (p0, e0), (p1, e1) in pairwise(pts):
        if num_params <= p1:
            w = math.log(num_params / p0) / math.log(p1 / p0)
            return e0 + w * (e1 - e0)
    return pts[-1][1]


def model_profile(spec: ModelSpec, gpu: GpuInfo = H200, assumptions: Assumptions = ASSUMPTIONS,
                  tp: int = 1) -> ModelProfile:  # fmt: skip
    """Graph and eager coefficients of one model (see the module docstring for each term)."""
    a = assumptions
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    bw = gpu.mem_bw_gbs * 1e9 / 1e3  # bytes per ms
    flops = gpu.matmul_tflops * 1e12 / 1e3  # FLOPs per ms
    bw_w = bw * stream_efficiency(spec.num_params)
    layers, small = spec.num_layers, a.small_kernels_per_layer
    head_flops = 2 * spec.vocab_size * spec.hidden_size
    body_flops = spec.flops_per_token - head_flops
    weights_ms = spec.decode_weight_bytes / tp / bw_w
    kernels_ms = (layers * small + a.kernels_fixed) * a.kernel_us / 1e3
    comm_ms = 2 * layers * a.allreduce_ms if tp > 1 else 0.0
    c_row = head_flops / tp / flops + 8 * spec.vocab_size / bw + a.row_fixed_ms  # fp32 logits: write + read
    c_ctx = spec.kv_bytes_per_token / tp / (bw * a.kv_read_eff)
    c_tok = body_flops / tp / flops + layers * small * spec.hidden_size * a.elementwise_bytes / tp / bw
    c_ext = 4 * layers * spec.num_heads * spec.head_dim * a.ext_ref_ctx / tp / flops
    per_token = {"c_row": _r(c_row), "c_ctx": _r(c_ctx), "c_tok": _r(c_tok), "c_ext": _r(c_ext)}
    graph = StepCoeffs(c0=_r(weights_ms + kernels_ms + comm_ms + a.graph_launch_ms), **per_token)
    host_ops = layers * (small + a.gemms_per_layer) + a.kernels_fixed
    eager = StepCoeffs(c0=_r(weights_ms + kernels_ms + comm_ms + a.eager_fixed_ms),
                       floor_ms=_r(host_ops * a.eager_op_us / 1e3), **per_token)  # fmt: skip
    return ModelProfile(weight_bytes=spec.weight_bytes, kv_bytes_per_token=spec.kv_bytes_per_token, tp=tp,
                        step=StepModes(graph=graph, eager=eager))  # fmt: skip


def std_serving_from(small: StepCoeffs, a: Assumptions = ASSUMPTIONS) -> StdServingInfo:
    """Per-hop bookkeeping (fixed + per 1k prefix tokens) reproducing the paper's two observations.

    With B = std_ref_batch rows, each a re-match with prefix x (ktok), overhead O(x) = B*(h0 + h1*x):
      I(x1) / (I(x1) + O(x1)) = f                      (inference share at the reference context x1)
      I(x2) + O(x2) = (I(x1) + O(x1)) / (1 - loss)     (step time at the long context x2)
    where I(x) is the small model's graph step (decode rows, B*x*1000 context tokens)."""
    b = a.std_ref_batch
    x1, x2 = a.std_ref_ctx / 1000, a.std_long_ctx / 1000
    i1 = small.at(b, b, 0, b * a.std_ref_ctx)
    i2 = small.at(b, b, 0, b * a.std_long_ctx)
    s1 = i1 / a.std_infer_fraction
    o1 = s1 - i1
    o2 = s1 / (1 - a.std_long_loss) - i2
    h1 = (o2 - o1) / (b * (x2 - x1))
    h0 = o1 / b - h1 * x1
    if h0 < 0 or h1 < 0:
        raise ValueError(f"std-serving assumptions give negative overheads ({h0:.3f} ms, {h1:.3f} ms/ktok)")
    return StdServingInfo(hop_overhead_ms=_r(h0), hop_overhead_ms_per_ktok=_r(h1))


def _source(gpu: GpuInfo, a: Assumptions) -> str:
    eff = ", ".join(f"{n} {g:.0f}" for n, g in MEASURED_STREAM_GBS.items())
    return (
        "python -m tokenrouter.calibration.analytic: bytes over bandwidth + FLOPs over peak + kernel/launch overhead "
        f"from ModelSpec shapes on {gpu.name} ({gpu.mem_bw_gbs:g} GB/s, {gpu.matmul_tflops:g} TFLOP/s); weight "
        f"streaming derated by the H200's measured MLP streaming efficiency ({eff} GB/s of "
        f"{MEASURED_COPY_GBS:.0f} copy), log-interpolated in parameter count; {a.small_kernels_per_layer} non-GEMM "
        f"kernels per layer at {a.kernel_us:g} us each in a graph and {a.eager_op_us:g} us of host time per eager op "
        "(measured on the H200); std_serving fitted to the TokenRouter paper's 4.2% inference share and 58% "
        "long-output loss; all assumptions in notes"
    )


def generate(models: Iterable[str] | None = None, *, gpu: GpuInfo = H200, created: str = H200_CREATED,
             assumptions: Assumptions = ASSUMPTIONS, tp: Mapping[str, int] | None = None) -> Profile:  # fmt: skip
    """The analytic profile for `models` (default: every bundled spec), ordered by parameter count."""
    a, tp = assumptions, dict(tp or {})
    if min(gpu.mem_bw_gbs, gpu.matmul_tflops, gpu.memory_gb) <= 0:
        raise ValueError(f"GPU figures must be > 0, got {gpu}")
    specs = sorted((load_spec(m) for m in (models or bundled_model_names())), key=lambda s: s.num_params)
    entries = {s.name: model_profile(s, gpu, a, tp.get(s.name, 1)) for s in specs}
    fused = replace(a, small_kernels_per_layer=a.std_ref_small_kernels_per_layer)
    ref = model_profile(load_spec(a.std_ref_model), gpu, fused).step.graph
    notes = {"assumptions": asdict(a), "measured_stream_gbs": dict(MEASURED_STREAM_GBS),
             "stream_efficiency": {s.name: _r(stream_efficiency(s.num_params)) for s in specs}}  # fmt: skip
    prof = Profile(schema_version=SCHEMA_VERSION, kind="analytic", gpu=gpu, created=created, source=_source(gpu, a),
                   models=entries, router_ms=a.router_ms, sched_ms=a.sched_ms, ipc_ms=a.ipc_ms,
                   link=LinkInfo(latency_ms=a.link_latency_ms, bandwidth_gbps=a.link_bandwidth_gbps),
                   mps=MpsInfo(default_slowdown=a.mps_default_slowdown, pairs={}),
                   std_serving=std_serving_from(ref, a), kv_budget_gb=a.kv_budget_gb, notes=notes)  # fmt: skip
    # Round-trip through the validator so a generated profile obeys exactly what loading enforces.
    return Profile.from_json(prof.to_json(), source="<generated analytic profile>")


def default_bundled_path() -> Path:
    return Path(__file__).resolve().parent / "profiles" / "h200-analytic.json"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenrouter.calibration.analytic", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_bundled_path(), help="output JSON (default: bundled file)")
    ap.add_argument("--models", nargs="*", default=None, help="model names (default: all bundled specs)")
    ap.add_argument("--created", default=H200_CREATED, help="ISO date recorded in the profile")
    ap.add_argument("--gpu-name", default=H200.name)
    ap.add_argument("--mem-bw-gbs", type=float, default=H200.mem_bw_gbs, help="copy bandwidth, GB/s")
    ap.add_argument("--matmul-tflops", type=float, default=H200.matmul_tflops, help="dense bf16, TFLOP/s")
    ap.add_argument("--memory-gb", type=float, default=H200.memory_gb)
    ap.add_argument("--small-kernels-per-layer", type=int, default=Assumptions().small_kernels_per_layer,
                    help="non-GEMM kernels per decoder layer (engine as written: %(default)s; fused engine: "
                    "~6)")  # fmt: skip
    ap.add_argument("--tp", action="append", default=[], metavar="MODEL=N", help="tensor-parallel degree")
    args = ap.parse_args(argv)
    try:
        tp = {k.lower(): int(v) for k, v in (item.split("=", 1) for item in args.tp)}
        gpu = GpuInfo(name=args.gpu_name, mem_bw_gbs=args.mem_bw_gbs, matmul_tflops=args.matmul_tflops,
                      memory_gb=args.memory_gb)  # fmt: skip
        a = Assumptions(small_kernels_per_layer=args.small_kernels_per_layer)
        prof = generate(args.models, gpu=gpu, created=args.created, assumptions=a, tp=tp)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = prof.save(args.out)
    print(f"wrote {out} ({len(prof.models)} models)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
