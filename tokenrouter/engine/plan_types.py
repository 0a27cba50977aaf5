"""What the host planner produces (`StepPlan`, one `PartPlan` per pass) and needs (`PlanContext`), shared by the
general planner (`step_plan`) and its decode fast path (`decode_plan`)."""

from __future__ import annotations

import random
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.request import Request
from tokenrouter.engine.inputs import Layout
from tokenrouter.engine.page_table import PageTable, TablePlan
from tokenrouter.engine.sampler import MAX_LOGPROBS, seed32
from tokenrouter.engine.varlen_shapes import VarlenShape, VarlenShapes


@dataclass(slots=True)
class PartPlan:
    layout: Layout
    packed: np.ndarray  # int32 [layout.size], a view of the staging buffer
    rows: list[int]  # batch row indices of this part, in batch order
    max_q_len: int
    bucket: int | None  # graph bucket (decode or varlen graph), None for an eager varlen part
    extra_upd: tuple[np.ndarray, np.ndarray] | None = None  # graph page writes beyond the graph's capacity
    varlen: VarlenShape | None = None  # the varlen graph shape this part was packed for (None: eager)


@dataclass(slots=True)
class StepPlan:
    graph: PartPlan | None
    eager: PartPlan | None
    table: TablePlan
    out_index: np.ndarray  # [R] int64: row -> index in the step's output (graph logit row j: j; eager: base + j)
    sampled: list[int]  # rows with a sampled token (live, sample=True), batch order
    skipped: list[int]  # stale rows
    live_reqs: list[Request]
    num_tokens: int  # fed tokens (both parts)
    sampled_slots: list[int]  # page-table slot of each `sampled` row (after commit: the request's slot)
    # (batch row, k) of the sampled rows that ask for log-probabilities (k capped at the vocabulary), batch order
    logprobs: list[tuple[int, int]] = field(default_factory=list)


@dataclass(slots=True)
class PlanContext:
    """What the planner needs from the engine (fixed per engine, plus the per-slot from_prev ledger)."""

    page_size: int
    max_context_len: int
    vocab_size: int
    rule: GraphRule  # disabled when the engine has no graphs (or they are switched off)
    table: PageTable
    slot_token_step: MutableSequence[int]  # [slots]: batch step_id that last sampled into the slot (-1: none)
    eager_out_base: int  # output index of the eager part's first logit row
    rng: random.Random  # seeds of sampled rows whose request has none
    varlen: VarlenShapes | None = None  # varlen graph shapes (None: the varlen part always runs eagerly)


def logprobs_asked(req: Request) -> int | None:
    """k of a request that asks for log-probabilities, None if none, -1 when outside 0..MAX_LOGPROBS."""
    k = req.sampling.logprobs
    if k is None:
        return None
    return k if 0 <= k <= MAX_LOGPROBS else -1


def write_requests(view: Callable[[str], np.ndarray], n_logit: int, samp: list, lpk: list[tuple[int, int]],
                   upd: tuple[list[int], list[int]], ctx: PlanContext) -> None:  # fmt: skip
    """The fields requests set: top_p 1.0 on `n_logit` rows, sampling of `samp` ((logit row, params) with
    temperature > 0; seeds from `ctx.rng` in order), `logprobs_k1` of `lpk` ((logit row, k)), page writes `upd`."""
    top_p = view("top_p").view(np.float32)
    top_p[:n_logit] = 1.0
    if samp:
        vocab, rng = ctx.vocab_size, ctx.rng
        js = [j for j, _ in samp]
        temps = np.asarray([p.temperature for _, p in samp], np.float32)
        view("inv_temp").view(np.float32)[js] = np.float32(1.0) / temps
        top_p[js] = [p.top_p for _, p in samp]
        view("top_k")[js] = [p.top_k if 0 < p.top_k < vocab else 0 for _, p in samp]
        seeds = []
        for _, p in samp:  # batch order, as the RNG must be drawn
            s = seed32(p.seed) if p.seed is not None else rng.getrandbits(32)
            seeds.append(s - (1 << 32) if s >= 1 << 31 else s)  # stored as int32 bits
        view("seed")[js] = seeds
    if lpk:
        view("logprobs_k1")[[j for j, _ in lpk]] = [k + 1 for _, k in lpk]
    if upd[0]:
        n = len(upd[0])
        view("upd_idx")[:n] = upd[0]
        view("upd_val")[:n] = upd[1]
