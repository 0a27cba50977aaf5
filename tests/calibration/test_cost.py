"""Cost model: step times from the bundled profile, placements, messages, and `ConstantCost`."""

from __future__ import annotations

from itertools import pairwise

import msgspec
import pytest

from tokenrouter.calibration import (
    ConstantCost,
    CostModel,
    ModelStepCost,
    PartStats,
    Profile,
    ProfileError,
    StepCost,
    StepStats,
    load_profile,
)
from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.request import Request

MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")
RULE = GraphRule(buckets=(1, 2, 4, 8, 16), max_row_tokens=4, allow_split=True)  # split priced as an option


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("h200-analytic")


@pytest.fixture(scope="module")
def cost(profile: Profile) -> CostModel:
    return CostModel(profile, "separate")


def _row(ctx: int, n: int = 1) -> BatchRow:
    req = Request(rid=f"r{ctx}-{n}", token_ids=list(range(ctx)), prompt_len=min(ctx, 16))
    return BatchRow(req=req, start=ctx - n, num_tokens=n)


def _batch(rows: list[BatchRow]) -> Batch:
    return Batch(model=0, step_id=0, rows=rows)


def one(rows: int, tokens: int, extend: int = 0, context: int = 0, *, graph: bool = True) -> StepStats:
    return StepStats.one_pass(rows, tokens, extend, context, graph=graph)


def test_step_stats_of_a_batch_follow_the_graph_rule_split() -> None:
    # rows (context, tokens): decode, 5-token return (too long for the graph), 20-token prefill, decode
    b = _batch([_row(100), _row(300, 5), _row(50, 20), _row(70, 1)])
    s = StepStats.of_batch(b, RULE, rematch=[1, 3])
    assert s.graph == PartStats(rows=2, tokens=2, extend_tokens=0, context_tokens=170)
    assert s.eager == PartStats(rows=2, tokens=25, extend_tokens=25, context_tokens=350, long_rows=1)
    assert (s.rematch_rows, s.rematch_prefix_tokens) == (2, 295 + 69)
    assert StepStats.of_batch(b, GraphRule(enabled=False)).graph == PartStats()
    b.graph_rows = [0]  # a scheduler's split wins over the rule
    assert StepStats.of_batch(b, RULE).graph.rows == 1


def test_a_split_step_pays_both_passes_and_the_eager_issue_floor(profile: Profile) -> None:
    c = CostModel(profile, "separate")
    for name in ("qwen3-0.6b", "qwen3-32b"):
        g, e = profile.model(name).step.graph, profile.model(name).step.eager
        b = _batch([_row(100), _row(300, 5), _row(70, 1)])
        s = StepStats.of_batch(b, RULE)
        # the graph part (2 decode rows) and the eager part (the 5-token row) each stream the weights once;
        # the eager part's host issue overlaps the graph replay, so only the larger of the two shows
        gpu = _gpu(g, 2, 2, 0, 170) + _gpu(e, 1, 5, 5, 300)
        assert c.for_model(name).step_ms(s) == pytest.approx(max(gpu, e.floor_ms))
        assert c.for_model(name).step_ms(one(2, 2, 0, 170)) == pytest.approx(g.at(2, 2, 0, 170))
        assert c.for_model(name).step_ms(one(1, 5, 5, 300, graph=False)) == pytest.approx(e.at(1, 5, 5, 300))


def _gpu(c, b: int, t: int, e: int, ctx: int) -> float:
    return c.c0 + c.c_row * b + c.c_ctx * ctx + c.c_tok * t + c.c_ext * e


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("graph", [True, False])
def test_monotonic_in_batch_size_and_context(cost: CostModel, model: str, graph: bool) -> None:
    mc = cost.for_model(model)
    by_batch = [mc.step_ms(one(b, b, 0, b * 1024, graph=graph)) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    by_ctx = [mc.step_ms(one(8, 8, 0, 8 * c, graph=graph)) for c in (128, 1024, 4096, 8192, 32768)]
    by_ext = [mc.step_ms(one(1, t, t, t, graph=graph)) for t in (2, 16, 256, 4096)]
    for seq in (by_batch, by_ctx, by_ext):
        assert all(x <= y for x, y in pairwise(seq)), seq  # eager may sit flat on its host floor
    if graph:
        for seq in (by_batch, by_ctx, by_ext):
            assert all(x < y for x, y in pairwise(seq)), seq


def test_bigger_models_cost_more(cost: CostModel) -> None:
    steps = [cost.for_model(m).step_ms(one(8, 8, 0, 8 * 1024)) for m in MODELS]
    assert steps == sorted(steps)


def test_empty_step_is_free(cost: CostModel) -> None:
    assert cost.for_model("qwen3-8b").step_ms(StepStats.of_batch(_batch([]), RULE)) == 0.0


def test_step_alone_is_the_same_under_every_placement(profile: Profile) -> None:
    s = one(8, 8, 0, 8192)
    base = CostModel(profile, "separate").for_model("qwen3-8b").step_ms(s)
    for placement in ("mps", "cross-host"):
        assert CostModel(profile, placement).for_model("qwen3-8b").step_ms(s) == base


def test_mps_pair_slowdown_against_colocated_model(profile: Profile) -> None:
    pairs = {"qwen3-0.6b|qwen3-32b": 1.6, "qwen3-32b|qwen3-0.6b": 1.1}
    p = msgspec.structs.replace(profile, mps=msgspec.structs.replace(profile.mps, pairs=pairs))
    c = CostModel(p, "mps", models=["qwen3-0.6b", "qwen3-32b"])
    assert c.for_model(0).name == "qwen3-0.6b"
    assert c.interference(0, 1).factor(4, 4) == pytest.approx(1.6)
    assert c.interference(1, 0).factor(4, 4) == pytest.approx(1.1)
    with pytest.raises(ProfileError, match="out of range"):
        c.for_model(2)


def test_a_small_eager_step_costs_the_eager_floor(profile: Profile) -> None:
    mc = CostModel(profile, "mps").for_model("qwen3-0.6b")
    floor = profile.model("qwen3-0.6b").step.eager.floor_ms
    assert mc.step_ms(one(1, 1, 0, 100, graph=False)) == pytest.approx(floor)


def test_rematch_adds_bookkeeping_per_row_and_prefix(profile: Profile) -> None:
    mc = CostModel(profile, "mps").for_model("qwen3-0.6b")
    s = profile.std_serving
    plain = mc.step_ms(one(8, 8, 0, 8000))
    rm = StepStats(one(8, 8, 0, 8000).graph, rematch_rows=3, rematch_prefix_tokens=6000)
    with_rm = mc.step_ms(rm)
    assert with_rm - plain == pytest.approx(3 * s.hop_overhead_ms + 6 * s.hop_overhead_ms_per_ktok)
    all_rows = mc.step_ms(StepStats(one(8, 8, 0, 8192).graph, rematch_rows=8, rematch_prefix_tokens=8 * 1023))
    assert all_rows > 5 * mc.step_ms(one(8, 8, 0, 8192))  # bookkeeping dominates, as in the paper


def test_message_time_by_placement(profile: Profile) -> None:
    for placement in ("mps", "separate"):
        c = CostModel(profile, placement)
        assert c.message_ms() == c.message_ms(10**6) == profile.ipc_ms
    x = CostModel(profile, "cross-host")
    link = profile.link
    nbytes = 10_240
    assert x.message_ms(nbytes) == pytest.approx(link.latency_ms + nbytes * 8 / (link.bandwidth_gbps * 1e9) * 1e3)
    assert x.message_ms(0) == pytest.approx(link.latency_ms)


def test_accessors_and_errors(profile: Profile) -> None:
    c = CostModel(profile, "mps", models=["Qwen/Qwen3-0.6B", "qwen3-32b"])
    assert c.models == ("qwen3-0.6b", "qwen3-32b")
    assert c.router_ms() == c.router_ms(0) == profile.router_ms
    assert c.sched_ms() == c.sched_ms("qwen3-32b") == profile.sched_ms
    assert c.kv_budget_gb(1) == profile.kv_budget_gb
    with pytest.raises(ValueError, match=r"placement .nvlink. unknown"):
        CostModel(profile, "nvlink")  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"known: .*qwen3-0\.6b"):
        c.for_model("gpt-5")
    assert isinstance(c, StepCost) and isinstance(c.for_model(0), ModelStepCost)


def test_constant_cost() -> None:
    c = ConstantCost({"small": 1.0, "large": lambda b: 10.0 + b, 2: 6.0})
    b3 = StepStats.of_batch(_batch([_row(10), _row(20), _row(30, 8)]), RULE)  # split 2 + 1: still 3 rows
    assert c.for_model("small").step_ms(b3) == 1.0 and c.for_model("large").step_ms(b3) == 13.0
    assert c.for_model(2).step_ms(one(7, 7)) == c.for_model(2).step_ms(one(8, 8)) == 6.0
    assert c.for_model(2).step_ms(StepStats(one(100, 100).graph, rematch_rows=3)) == 6.0
    assert c.for_model("small").step_ms(StepStats()) == 0.0
    assert c.message_ms(10**9) == c.router_ms("small") == c.sched_ms() == 0.0
    by_index = ConstantCost([2.0, 30.0], sched_ms=0.5)
    assert by_index.for_model(1).step_ms(one(4, 4)) == 30.0 and by_index.sched_ms(1) == 0.5
    assert isinstance(by_index, StepCost) and isinstance(by_index.for_model(0), ModelStepCost)
    with pytest.raises(KeyError, match="known: 0, 1"):
        by_index.for_model(2)
