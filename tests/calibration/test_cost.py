"""Cost model: step times from the bundled profile, placements, messages, and `ConstantCost`."""

from __future__ import annotations

from itertools import pairwise

import msgspec
import pytest

from tokenrouter.calibration import (
    ConstantCost,
    CostModel,
    ModelStepCost,
    Profile,
    ProfileError,
    StepCost,
    batch_summary,
    load_profile,
)
from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request

MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("h200")


@pytest.fixture(scope="module")
def cost(profile: Profile) -> CostModel:
    return CostModel(profile, "separate")


def _row(ctx: int, n: int = 1, rematch: bool = False) -> BatchRow:
    req = Request(rid=f"r{ctx}-{n}", token_ids=list(range(ctx)), prompt_len=min(ctx, 16))
    return BatchRow(req=req, start=ctx - n, num_tokens=n, rematch=rematch)


def _batch(rows: list[BatchRow]) -> Batch:
    return Batch(model=0, step_id=0, rows=rows)


def test_batch_summary_matches_batch_properties() -> None:
    b = _batch([_row(100), _row(300, 5), _row(50, 20, rematch=True), _row(70, 1, rematch=True)])
    want = (b.size, b.num_tokens, b.num_extend_tokens, b.context_tokens, b.num_rematch, b.rematch_context_tokens)
    assert batch_summary(b) == want == (4, 27, 25, 520, 2, 99)


def test_step_ms_of_batch_equals_primitive(cost: CostModel) -> None:
    b = _batch([_row(1000), _row(2000, 4), _row(500, 1, rematch=True)])
    for graph in (True, False):
        want = cost.step_ms_from("qwen3-8b", 3, 6, 4, 3500, 1, 499, graph=graph)
        assert cost.step_ms("qwen3-8b", b, graph=graph) == pytest.approx(want)
        assert cost.for_model("qwen3-8b").step_ms(b, graph=graph) == pytest.approx(want)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("graph", [True, False])
def test_monotonic_in_batch_size_and_context(cost: CostModel, model: str, graph: bool) -> None:
    mc = cost.for_model(model)
    by_batch = [mc.step_ms_from(b, b, 0, b * 1024, graph=graph) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    by_ctx = [mc.step_ms_from(8, 8, 0, 8 * c, graph=graph) for c in (128, 1024, 4096, 8192, 32768)]
    by_ext = [mc.step_ms_from(1, t, t, t, graph=graph) for t in (2, 16, 256, 4096)]
    for seq in (by_batch, by_ctx, by_ext):
        assert all(x <= y for x, y in pairwise(seq)), seq  # eager may sit flat on its host floor
    if graph:
        for seq in (by_batch, by_ctx, by_ext):
            assert all(x < y for x, y in pairwise(seq)), seq


def test_bigger_models_cost_more(cost: CostModel) -> None:
    steps = [cost.step_ms_from(m, 8, 8, 0, 8 * 1024) for m in MODELS]
    assert steps == sorted(steps)


def test_empty_batch_is_free(cost: CostModel) -> None:
    assert cost.step_ms("qwen3-8b", _batch([])) == 0.0


def test_mps_slowdown_only_under_mps_when_corunning(profile: Profile) -> None:
    args = ("qwen3-8b", 8, 8, 0, 8192)
    base = CostModel(profile, "separate").step_ms_from(*args)
    for placement in ("separate", "cross-host"):
        c = CostModel(profile, placement)
        assert c.step_ms_from(*args, corunning=True) == base
    mps = CostModel(profile, "mps")
    assert mps.step_ms_from(*args) == base
    assert mps.step_ms_from(*args, corunning=True) == pytest.approx(base * profile.mps.default_slowdown)


def test_mps_pair_slowdown_against_colocated_model(profile: Profile) -> None:
    pairs = {"qwen3-0.6b|qwen3-32b": 1.6, "qwen3-32b|qwen3-0.6b": 1.1}
    p = msgspec.structs.replace(profile, mps=msgspec.structs.replace(profile.mps, pairs=pairs))
    c = CostModel(p, "mps", models=["qwen3-0.6b", "qwen3-32b"])
    small = c.for_model(0)
    assert small.name == "qwen3-0.6b"
    base = small.step_ms_from(4, 4, 0, 4000)
    assert small.step_ms_from(4, 4, 0, 4000, corunning=True) == pytest.approx(1.6 * base)
    big = c.for_model(1)
    assert big.step_ms_from(4, 4, 0, 4000, corunning=True) == pytest.approx(1.1 * big.step_ms_from(4, 4, 0, 4000))
    with pytest.raises(ProfileError, match="out of range"):
        c.for_model(2)


def test_eager_floor_is_not_slowed_by_mps(profile: Profile) -> None:
    mc = CostModel(profile, "mps").for_model("qwen3-0.6b")
    floor = profile.model("qwen3-0.6b").step.eager.floor_ms
    assert mc.step_ms_from(1, 1, 0, 100, graph=False, corunning=True) == pytest.approx(floor)


def test_rematch_adds_bookkeeping_per_row_and_prefix(profile: Profile) -> None:
    c = CostModel(profile, "mps")
    s = profile.std_serving
    plain = c.step_ms_from("qwen3-0.6b", 8, 8, 0, 8000, corunning=True)
    with_rm = c.step_ms_from("qwen3-0.6b", 8, 8, 0, 8000, rematch=3, rematch_ctx=6000, corunning=True)
    # Host bookkeeping: added after the MPS factor, not multiplied by it.
    assert with_rm - plain == pytest.approx(3 * s.hop_overhead_ms + 6 * s.hop_overhead_ms_per_ktok)
    all_rows = c.step_ms_from("qwen3-0.6b", 8, 8, 0, 8192, rematch=8, rematch_ctx=8 * 1023)
    assert all_rows > 5 * c.step_ms_from("qwen3-0.6b", 8, 8, 0, 8192)  # bookkeeping dominates, as in the paper


def test_graph_flags_per_model_and_graph_bucket_limit(profile: Profile) -> None:
    c = CostModel(profile, "separate", graphs={"qwen3-0.6b": False})
    g, e = profile.model("qwen3-0.6b").step.graph, profile.model("qwen3-0.6b").step.eager
    assert c.step_ms_from("qwen3-0.6b", 1, 1, 0, 100) == pytest.approx(e.at(1, 1, 0, 100))
    assert c.step_ms_from("qwen3-0.6b", 1, 1, 0, 100, graph=True) == pytest.approx(g.at(1, 1, 0, 100))
    big = profile.model("qwen3-8b").step.graph
    assert c.step_ms_from("qwen3-8b", 1, 1, 0, 100) == pytest.approx(big.at(1, 1, 0, 100))
    limited = CostModel(profile, "separate", graph_max_tokens=64)
    assert limited.step_ms_from("qwen3-0.6b", 64, 64, 0, 64) == pytest.approx(g.at(64, 64, 0, 64))
    assert limited.step_ms_from("qwen3-0.6b", 1, 65, 65, 65) == pytest.approx(e.at(1, 65, 65, 65))


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
    c = CostModel("h200", "mps", models=["Qwen/Qwen3-0.6B", "qwen3-32b"])
    assert c.models == ("qwen3-0.6b", "qwen3-32b")
    assert c.router_ms() == c.router_ms(0) == profile.router_ms
    assert c.sched_ms() == c.sched_ms("qwen3-32b") == profile.sched_ms
    assert c.kv_budget_gb(1) == profile.kv_budget_gb
    with pytest.raises(ValueError, match="unknown placement"):
        CostModel(profile, "nvlink")  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"known: .*qwen3-0\.6b"):
        c.for_model("gpt-5")
    assert isinstance(c, StepCost) and isinstance(c.for_model(0), ModelStepCost)


def test_constant_cost() -> None:
    c = ConstantCost({"small": 1.0, "large": lambda b: 10.0 + b, 2: {1: 5.0, 8: 6.0}})
    b3 = _batch([_row(10), _row(20), _row(30, 4)])
    assert c.step_ms("small", b3) == 1.0 and c.step_ms("large", b3) == 13.0
    assert c.step_ms_from(2, 7, 7, 0, 70) == 5.0 and c.step_ms_from(2, 8, 8, 0, 80) == 6.0
    assert c.step_ms_from(2, 100, 100, 0, 1000, rematch=3, corunning=True) == 6.0
    assert c.step_ms("small", _batch([])) == 0.0
    assert c.message_ms(10**9) == c.router_ms("small") == c.sched_ms() == 0.0
    by_index = ConstantCost([2.0, 30.0])
    assert by_index.for_model(1).step_ms_from(4) == 30.0
    assert isinstance(by_index, StepCost) and isinstance(by_index.for_model(0), ModelStepCost)
    with pytest.raises(KeyError, match="known: 0, 1"):
        by_index.for_model(2)


def test_step_ms_is_cheap(cost: CostModel) -> None:
    import time

    mc = cost.for_model("qwen3-8b")
    t0 = time.perf_counter()
    for i in range(100_000):
        mc.step_ms_from(8, 8, 0, 8000 + i)
    assert time.perf_counter() - t0 < 2.0  # ~0.1 s typical; a generous bound against a slow CI box
