"""A model at tp > 1 without an entry measured at that degree: an estimate from its tp=1 entry, labelled so
(`TpEstimate.note`; the formula: docs/calibration.md, Tensor parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from tokenrouter.models.spec import ModelSpec

from .assumptions import Assumptions
from .measured import MeasuredPasses, PassTable
from .profile import AllReduceInfo, ModelProfile, ProfileError, StepCoeffs, StepModes

# Assumed all-reduce on one host over NVLink when the profile measured none (why these values: docs/calibration.md).
ASSUMED_ALLREDUCE = AllReduceInfo(latency_ms=0.010, bus_bandwidth_gbs=300.0)


@dataclass(frozen=True, slots=True)
class AllReduceCost:
    """One all-reduce of `n` bytes over `tp` ranks: latency + n * 2(tp-1)/tp / bus bandwidth (ms)."""

    latency_ms: float
    bus_bandwidth_gbs: float
    measured: bool

    @classmethod
    def of(cls, info: AllReduceInfo | None) -> AllReduceCost:
        src = info or ASSUMED_ALLREDUCE
        return cls(src.latency_ms, src.bus_bandwidth_gbs, measured=info is not None)

    def ms_per_byte(self, tp: int) -> float:
        return 2.0 * (tp - 1) / tp / (self.bus_bandwidth_gbs * 1e6)  # GB/s -> bytes per ms

    def describe(self) -> str:
        src = "measured (profile allreduce)" if self.measured else "ASSUMED, not measured"
        return f"{self.latency_ms * 1000:.0f} us + bytes / {self.bus_bandwidth_gbs:g} GB/s bus bandwidth ({src})"


@dataclass(frozen=True, slots=True)
class TpEstimate:
    """How a tp entry was made: `note` is the line the CLIs print."""

    entry: ModelProfile
    note: str


ASSUMPTIONS = Assumptions()


def pass_floor_ms(spec: ModelSpec, graph: bool, a: Assumptions = ASSUMPTIONS) -> float:
    """The part of one pass that does not shrink with tp: every small kernel's fixed device time and the launch."""
    kernels = (spec.num_layers * a.small_kernels_per_layer + a.kernels_fixed) * a.kernel_us / 1e3
    return kernels + (a.graph_launch_ms if graph else a.eager_fixed_ms)


def estimate_tp(entry: ModelProfile, spec: ModelSpec, tp: int, allreduce: AllReduceCost, name: str = "",
                assumptions: Assumptions = ASSUMPTIONS) -> TpEstimate:  # fmt: skip
    """`entry` (tp = 1) as it would run at `tp` (see the module docstring)."""
    if tp < 2:
        raise ValueError(f"estimate_tp is for tp >= 2, got {tp}")
    if entry.tp != 1:
        raise ProfileError(f"{name or spec.name}: the profile has it at tp={entry.tp} only; a tp={tp} estimate "
                           "starts from a tp=1 entry (measure it, or add a NAME@tp{tp} entry)")  # fmt: skip
    hidden_bytes = spec.hidden_size * spec.dtype_bytes
    calls = 2 * spec.num_layers
    ar0 = calls * allreduce.latency_ms
    ar_tok = calls * allreduce.ms_per_byte(tp) * hidden_bytes  # per token fed
    fg = pass_floor_ms(spec, True, assumptions)
    fe = pass_floor_ms(spec, False, assumptions)

    def split(t: float, floor: float) -> float:
        f = min(floor, t)
        return f + (t - f) / tp

    def coeffs(c: StepCoeffs, floor: float) -> StepCoeffs:
        return StepCoeffs(c0=split(c.c0, floor) + ar0, c_row=c.c_row / tp, c_ctx=c.c_ctx / tp,
                          c_tok=c.c_tok / tp + ar_tok, c_ext=c.c_ext / tp, floor_ms=c.floor_ms)  # fmt: skip

    def table(t: PassTable, floor: float) -> PassTable:
        knot_ms = [split(ms, floor) + ar0 + ar_tok * k for k, ms in zip(t.knots, t.knot_ms, strict=True)]
        return PassTable(points=[], fit=t.fit, round_up=t.round_up, knots=list(t.knots), knot_ms=knot_ms,
                         ctx_ms=t.ctx_ms / tp, row_ms=t.row_ms / tp, ext_ms=t.ext_ms / tp,
                         linear_c0=split(t.linear_c0, floor) + ar0, linear_c_row=t.linear_c_row / tp,
                         linear_c_ctx=t.linear_c_ctx / tp, linear_c_tok=t.linear_c_tok / tp + ar_tok,
                         linear_c_ext=t.linear_c_ext / tp)  # fmt: skip

    passes = None
    if entry.passes is not None:
        p = entry.passes
        varlen = table(p.varlen, fg) if p.varlen is not None else None
        passes = MeasuredPasses(decode=table(p.decode, fg), varlen=varlen, eager=table(p.eager, fe),
                                max_row_tokens=p.max_row_tokens, varlen_max_pad=p.varlen_max_pad,
                                varlen_max_long_rows=p.varlen_max_long_rows)  # fmt: skip
    step = StepModes(graph=coeffs(entry.step.graph, fg), eager=coeffs(entry.step.eager, fe))
    out = msgspec.structs.replace(entry, tp=tp, step=step, passes=passes, routers=dict(entry.routers))
    note = (f"{name or spec.name} at tp={tp}: ESTIMATED from its tp=1 entry, not measured: time beyond a "
            f"{fg:.2f} ms per-pass floor split over {tp} ranks, plus {calls} all-reduces per step at "
            f"{allreduce.describe()}")  # fmt: skip
    return TpEstimate(out, note)
