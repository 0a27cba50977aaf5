"""The measured parts of a profile (schema 2): forward-pass tables, host and router costs, the runtime's own costs,
and co-location grids (docs/calibration.md). `tr calibrate` writes them; an analytic profile has none of them.
Units: ms, tokens, and percent (1-100) for MPS SM shares (100 = no cap). Tables, not only coefficients: a captured
step pays its whole CUDA-graph bucket, so its time is a step function of tokens.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

NonNeg = Annotated[float, msgspec.Meta(ge=0.0)]
Share = Annotated[int, msgspec.Meta(ge=1, le=100)]


class ProfileStruct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every part of a profile: immutable, keyword-only, and strict (a misspelt field is an error, not
    silently ignored). Defaults are written out, so a saved profile does not depend on today's defaults."""


class PassPoint(ProfileStruct, kw_only=True):
    """One measured pass: `rows` rows feeding `tokens` tokens (`extend_tokens` of them in rows of more than one
    token), attending `context_tokens` keys in all; `ms` the median over repeats, `spread` (p90 - p10) / median."""

    tokens: Annotated[int, msgspec.Meta(ge=1)]
    rows: Annotated[int, msgspec.Meta(ge=1)]
    context_tokens: Annotated[int, msgspec.Meta(ge=0)]
    extend_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    ms: NonNeg
    spread: NonNeg = 0.0


class FitError(ProfileStruct, kw_only=True):
    """Relative error |fit - measured| / measured on points the fit did not see."""

    median: NonNeg
    max: NonNeg
    points: Annotated[int, msgspec.Meta(ge=0)]


class PassTable(ProfileStruct, kw_only=True):
    """Time of one kind of forward pass, measured and fitted. `fit == "buckets"`: ms = knot_ms(T) + ctx_ms *
    context_tokens + row_ms * rows + ext_ms * extend_tokens, where knot_ms takes the smallest knot >= T (`round_up`: a
    captured graph pays its whole bucket) or interpolates linearly between knots (eager: no padding), clamped beyond the
    last knot by the last segment's slope. `fit == "linear"`: ms = `linear.at(rows, tokens, extend_tokens,
    context_tokens)`. Both are stored; `fit` names the one with the smaller held-out error (`errors[fit]`)."""

    points: list[PassPoint]
    held_out: list[PassPoint] = msgspec.field(default_factory=list)
    fit: Literal["buckets", "linear"]
    round_up: bool
    knots: list[int]
    knot_ms: list[float]
    ctx_ms: NonNeg = 0.0
    row_ms: NonNeg = 0.0
    ext_ms: NonNeg = 0.0
    linear_c0: NonNeg = 0.0
    linear_c_row: NonNeg = 0.0
    linear_c_ctx: NonNeg = 0.0
    linear_c_tok: NonNeg = 0.0
    linear_c_ext: NonNeg = 0.0
    errors: dict[str, FitError] = msgspec.field(default_factory=dict)


class MeasuredPasses(ProfileStruct, kw_only=True):
    """The three passes of the engine: `decode` (decode CUDA graphs: rows of at most `max_row_tokens` tokens, at
    most the largest knot in all), `varlen` (varlen CUDA graphs, up to `varlen_max_long_rows` long rows) and
    `eager` (a varlen pass without a graph: graphs off, a step no varlen graph holds, or more padding than
    `varlen_max_pad` tokens)."""

    decode: PassTable
    varlen: PassTable | None = None
    eager: PassTable
    max_row_tokens: Annotated[int, msgspec.Meta(ge=1)] = 8
    varlen_max_pad: int | None = None
    varlen_max_long_rows: Annotated[int, msgspec.Meta(ge=1)] = 8


class HostCosts(ProfileStruct, kw_only=True):
    """Host time of the subserver loop per step (forming the batch, planning, post-processing):
    `c0_ms + row_ms * rows`. Without overlap it adds to the GPU time; with overlap the loop adds
    `overlap_frac` of the GPU time (what the host could not hide)."""

    c0_ms: NonNeg
    row_ms: NonNeg = 0.0
    overlap_frac: NonNeg = 0.0


class RouterCost(ProfileStruct, kw_only=True):
    """A learned router's device part inside the step: `c0_ms + row_ms * rows`."""

    c0_ms: NonNeg
    row_ms: NonNeg = 0.0


class RuntimeInfo(ProfileStruct, kw_only=True):
    """The runtime's own costs, measured on the calibrating machine. `ipc_ms` / `tcp_ms`: one peer message one way
    (ZeroMQ, ipc:// and tcp loopback); `gate_rtt_ms`: one round trip to the sync coordinator; `gate_rtts_per_step`:
    messages a subserver sends the coordinator per launched step under each sync policy; `prepare_margin_ms`: with
    overlap, step k+1 is formed this long before step k's estimated end."""

    ipc_ms: NonNeg
    tcp_ms: NonNeg
    gate_rtt_ms: NonNeg
    gate_rtts_per_step: dict[str, NonNeg] = msgspec.field(default_factory=dict)
    prepare_margin_ms: NonNeg = 1.0


class CoRunShare(ProfileStruct, kw_only=True):
    """One MPS SM split of a pair (a, b): each model's decode step alone under its own share, and while the other
    steps back to back at each of its batch sizes. `corun_a_ms[i][j]`: a at batches_a[i] beside b at
    batches_b[j]; `corun_b_ms[i][j]`: b at batches_b[j] beside a at batches_a[i]."""

    share_a: Share = 100
    share_b: Share = 100
    alone_a_ms: list[float]
    alone_b_ms: list[float]
    corun_a_ms: list[list[float]]
    corun_b_ms: list[list[float]]


class CoRunGrid(ProfileStruct, kw_only=True):
    """Co-location of models a and b on one GPU, at decode steps of `context` tokens per row. `arrangement`: "mps" (one
    process per model under CUDA MPS; `shares` holds each measured SM split), or a one-process alternative (two engines,
    two threads): "stream-priority" or "green-context", with its settings in `detail` and one entry in `shares` (shares
    100). `reference_a_ms` / `reference_b_ms`: each model alone with no SM cap, the denominators of every slowdown. An
    unmeasured split is not guessed: asking for one is an error that lists the measured splits."""

    arrangement: str = "mps"
    detail: dict[str, int] = msgspec.field(default_factory=dict)
    model_a: str
    model_b: str
    context: Annotated[int, msgspec.Meta(ge=0)]
    batches_a: list[int]
    batches_b: list[int]
    reference_a_ms: list[float]
    reference_b_ms: list[float]
    shares: list[CoRunShare]
    errors: dict[str, FitError] = msgspec.field(default_factory=dict)
