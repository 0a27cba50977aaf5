"""Estimated profiles: a measured profile carried to a GPU kind the user does not have by datasheet figures (the
method, what is kept and what is not modelled: docs/calibration.md, "Estimated profiles for other GPUs").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from tokenrouter.deploy.kv_budget import MEM_FRACTION, kv_room_gb
from tokenrouter.models.spec import load_spec

from .gpus import GPU_SPECS, GpuSpec, gpu_kind
from .measured import PassTable
from .profile import EstimatedFrom, GpuInfo, ModelProfile, Profile, StepCoeffs, StepModes

METHOD = "bytes/FLOPs scaling"
MIN_KV_GB = 1.0  # the least KV cache a model needs beside its weights to count as fitting

_replace = msgspec.structs.replace


@dataclass(frozen=True, slots=True)
class Scale:
    """Factors on times (> 1: slower): `bandwidth` on weight streaming and per-row terms, `kv` on KV reads (ctx
    terms), `flops` on compute (tok/ext terms). Launch and host costs take none."""

    bandwidth: float
    kv: float
    flops: float


def scale_table(t: PassTable, weights_ms: float, flop_ms_per_token: float, s: Scale) -> PassTable:
    """`t` with its weights, launch and compute parts scaled. `weights_ms`: the pass's weight streaming on the anchor;
    `flop_ms_per_token`: the ideal compute per fed token there. Measured points are dropped."""
    weights = [min(weights_ms, ms) for ms in t.knot_ms]
    # Launch is read where the pass computes least; every knot keeps it. Written as the measured time plus what
    # changes, so unit factors give the table back bit for bit.
    launch = max(0.0, t.knot_ms[0] - weights[0] - t.knots[0] * flop_ms_per_token)
    knot_ms = [ms + w * (s.bandwidth - 1.0) + max(0.0, ms - w - launch) * (s.flops - 1.0)
               for ms, w in zip(t.knot_ms, weights, strict=True)]  # fmt: skip
    lin = _scale_line(t.linear_c0, weights_ms, s)
    return _replace(
        t, points=[], held_out=[], errors={}, knot_ms=knot_ms, ctx_ms=t.ctx_ms * s.kv,
        row_ms=t.row_ms * s.bandwidth, ext_ms=t.ext_ms * s.flops, linear_c0=lin,
        linear_c_row=t.linear_c_row * s.bandwidth, linear_c_ctx=t.linear_c_ctx * s.kv,
        linear_c_tok=t.linear_c_tok * s.flops, linear_c_ext=t.linear_c_ext * s.flops,
    )  # fmt: skip


def _scale_line(c0: float, weights_ms: float, s: Scale) -> float:
    """An intercept (no tokens fed, so no compute): launch kept, weight streaming scaled."""
    return c0 + min(weights_ms, c0) * (s.bandwidth - 1.0)


def _scale_coeffs(c: StepCoeffs, weights_ms: float, s: Scale) -> StepCoeffs:
    return _replace(c, c0=_scale_line(c.c0, weights_ms, s), c_row=c.c_row * s.bandwidth, c_ctx=c.c_ctx * s.kv,
                    c_tok=c.c_tok * s.flops, c_ext=c.c_ext * s.flops)  # fmt: skip


def scale_entry(m: ModelProfile, weights_ms: float, flop_ms_per_token: float, s: Scale) -> ModelProfile:
    """One model's step coefficients and pass tables scaled; host and router costs kept."""
    p = m.passes
    if p is not None:
        p = _replace(p, decode=scale_table(p.decode, weights_ms, flop_ms_per_token, s),
                     varlen=None if p.varlen is None else scale_table(p.varlen, weights_ms, flop_ms_per_token, s),
                     eager=scale_table(p.eager, weights_ms, flop_ms_per_token, s))  # fmt: skip
    step = StepModes(graph=_scale_coeffs(m.step.graph, weights_ms, s), eager=_scale_coeffs(m.step.eager, weights_ms, s))
    return _replace(m, step=step, passes=p)


def anchor_rates(anchor: Profile, name: str, m: ModelProfile) -> tuple[float, float]:
    """(ms to stream the weights a pass reads, ideal compute ms per fed token) of entry `name` on the anchor's GPU,
    at its measured bandwidth and GEMM rate, per tp rank."""
    spec = load_spec(name.partition("@tp")[0])
    weights_ms = spec.decode_weight_bytes / m.tp / (anchor.gpu.mem_bw_gbs * 1e6)  # GB/s -> bytes per ms
    return weights_ms, spec.flops_per_token / m.tp / (anchor.gpu.matmul_tflops * 1e9)  # TFLOP/s -> FLOP per ms


def estimate_profile(anchor: Profile, target: str, *, anchor_name: str = "") -> Profile:
    """`anchor` (a profile of a GPU in `GPU_SPECS`) estimated for GPU kind `target`."""
    have, want = GPU_SPECS[gpu_kind(anchor.gpu.name)], GPU_SPECS[gpu_kind(target)]
    s = Scale(have.mem_bw_gbs / want.mem_bw_gbs, have.mem_bw_gbs / want.mem_bw_gbs, have.bf16_tflops / want.bf16_tflops)
    models = {}
    for name, m in anchor.models.items():
        e = scale_entry(m, *anchor_rates(anchor, name, m), s)
        room = kv_room_gb(want.memory_gb, m.weight_bytes, m.tp)
        budget = anchor.kv_budget_gb if m.kv_budget_gb is None else m.kv_budget_gb
        models[name] = e if room >= budget else _replace(e, kv_budget_gb=max(0.0, room))
    allreduce = anchor.allreduce
    if allreduce is not None:
        bus = allreduce.bus_bandwidth_gbs * want.interconnect_gbs / have.interconnect_gbs
        allreduce = _replace(allreduce, bus_bandwidth_gbs=bus)
    src = EstimatedFrom(anchor=f"{anchor_name or anchor.gpu.name} {anchor.kind} {anchor.created[:10]}", method=METHOD,
                        target=gpu_kind(target))  # fmt: skip
    gpu = GpuInfo(name=want.name, mem_bw_gbs=want.mem_bw_gbs * anchor.gpu.mem_bw_gbs / have.mem_bw_gbs,
                  matmul_tflops=want.bf16_tflops * anchor.gpu.matmul_tflops / have.bf16_tflops,
                  memory_gb=want.memory_gb)  # fmt: skip
    kept = "launch and host costs, router/runtime costs, link, std_serving, co-location slowdown ratios"
    notes = {"scale": {"bandwidth": s.bandwidth, "kv": s.kv, "flops": s.flops}, "kept": kept}
    source = (f"estimated for {want.name} from {src.anchor} ({anchor.gpu.name}) by {METHOD} of datasheet figures "
              "(tokenrouter.calibration.estimate)")  # fmt: skip
    prof = _replace(anchor, kind="estimated", estimated_from=src, gpu=gpu, source=source, command="", models=models,
                    allreduce=allreduce, notes=notes)  # fmt: skip
    return Profile.from_json(prof.to_json(), source=f"<{src.target} estimated from {src.anchor}>")


def profile_label(profile: Profile) -> str:
    """The mark printed beside every number resting on an estimated profile; "" for a measured or analytic one."""
    e = profile.estimated_from
    if profile.kind != "estimated" or isinstance(e, msgspec.UnsetType):
        return ""
    return f"ESTIMATED ({e.target} from {e.anchor}, {e.method})"


def fit_error(gpu: str | GpuSpec | Profile, models: str | Sequence[str], tp: int = 1,
              min_kv_gb: float = MIN_KV_GB) -> str:  # fmt: skip
    """Why `models` (sharing one GPU, each split over `tp` GPUs) do not fit `gpu`: one line, or "" when their weights
    plus `min_kv_gb` of KV each fit `MEM_FRACTION` of its memory."""
    if isinstance(gpu, Profile):
        mem, label = gpu.gpu.memory_gb, gpu.gpu.name
    else:
        spec = gpu if isinstance(gpu, GpuSpec) else GPU_SPECS[gpu_kind(gpu)]
        mem, label = spec.memory_gb, spec.name
    names = [models] if isinstance(models, str) else list(models)
    weights = sum(load_spec(n).weight_bytes for n in names) / tp / 1e9
    need = weights + min_kv_gb * len(names)
    if need <= mem * MEM_FRACTION:
        return ""
    return (f"{' + '.join(names)} at tp={tp} needs {need:.1f} GB per GPU ({weights:.1f} GB weights + {min_kv_gb:g} GB "
            f"KV each) but {label} has {mem * MEM_FRACTION:.1f} GB usable ({MEM_FRACTION:.0%} of "
            f"{mem:g} GB)")  # fmt: skip


def fits(gpu: str | GpuSpec | Profile, models: str | Sequence[str], tp: int = 1, min_kv_gb: float = MIN_KV_GB) -> bool:
    """Whether `models` fit `gpu` (see `fit_error`)."""
    return not fit_error(gpu, models, tp, min_kv_gb)
