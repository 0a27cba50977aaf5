"""Names users type at the CLI and in the deployment config, as `StrEnum`s: a member equals its spelling, YAML and
JSON write the plain string, and an unknown name fails in one place with the list of known ones.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

E = TypeVar("E", bound=StrEnum)


class RouterName(StrEnum):
    """Routing algorithms (hand-back semantics in `tokenrouter.routers.presets`), plus trace replay."""

    R2R = "r2r"
    CITER = "citer"
    CO_LLM = "co-llm"
    R_STITCH = "r-stitch"
    MARKOV = "markov"
    ME = "me"
    TRACE = "trace"


class Placement(StrEnum):
    """Where the models run: all on one GPU under CUDA MPS, one GPU each, or one host each."""

    MPS = "mps"
    SEPARATE = "separate"
    CROSS_HOST = "cross-host"


class Layout(StrEnum):
    """A small/large pair laid out on G GPUs (`trsim tune --placements`): the `Placement` modes `mps` and `separate`,
    or `tp`: placement `mps` with the large model tensor-parallel over all G GPUs."""

    MPS = "mps"
    SEPARATE = "separate"
    TP = "tp"


class TuneObjective(StrEnum):
    """What `trsim tune` optimises when it chooses among layouts: throughput, throughput per GPU used, or (least)
    USD per million output tokens at the GPUs' prices."""

    TOTAL = "total"
    PER_GPU = "per-gpu"
    COST = "cost"


class Baseline(StrEnum):
    """What `tr serve --baseline` serves instead of the routed runtime; std-serving (a server per model, every hop
    a new request) is also a deployment's `baseline`. The batching policies are `core.policy.PolicyKind`."""

    STD_SERVING = "std-serving"
    LLM_ONLY = "llm-only"
    SLM_ONLY = "slm-only"


def parse_name(enum: type[E], value: str | E, what: str) -> E:
    """`value` as a member of `enum` (case-insensitive); a one-line ValueError naming `what` and the choices."""
    if isinstance(value, enum):
        return value
    try:
        return enum(str(value).strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise ValueError(f"{what} {value!r} unknown; choose one of {choices}") from None
