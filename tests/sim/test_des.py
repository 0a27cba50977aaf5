from __future__ import annotations

import dataclasses

import pytest

from tokenrouter.calibration.cost import ConstantCost
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig, PolicyConfig, RouterConfig
from tokenrouter.sim.run import SimConfig, run_sim


def deployment(
    policy: str = "eager", thresholds=(), hop: float = 0.1, router: str = "r2r", placement="mps", **router_kw
) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b", gpus=[0] if placement == "mps" else [1])],
        placement=PlacementConfig(placement),
        policy=PolicyConfig("eager" if policy == "std-serving" else policy, list(thresholds)),
        baseline="std-serving" if policy == "std-serving" else None,
        router=RouterConfig(router, hop_rate=hop, **router_kw),
    )


def test_no_hops_gives_exactly_n_over_small_step_time():
    n = 4
    small = lambda b: 5.0 + 0.5 * b  # noqa: E731  (L_small depends on batch size)
    cfg = SimConfig(
        deployment(hop=0.0),
        workload="low-effort",
        num_requests=12,
        concurrency=n,
        max_output=300,
        cost=ConstantCost([small, 30.0]),
    )
    res = run_sim(cfg)
    assert res.summary["steady_output_throughput_tok_s"] == pytest.approx(n / (small(n) / 1000), rel=1e-9)
    assert res.summary["tokens_model1"] == 0 and res.summary["hops_mean"] == 0


def test_hops_reach_the_large_model_and_all_requests_finish():
    res = run_sim(
        SimConfig(
            deployment(hop=0.2), workload="fixed:32,200", num_requests=16, concurrency=4, cost=ConstantCost([6.0, 28.0])
        )
    )
    s = res.summary
    assert s["requests_completed"] == 16 and s["total_output_tokens"] == 16 * 200
    # R2R: the large model writes one token per hop, so its share is about p (tokens stay on the small otherwise)
    assert 0.12 < s["token_frac_model1"] < 0.25
    assert s["hops_mean"] == pytest.approx(200 * s["token_frac_model1"], rel=0.01)


def test_same_seed_same_result_and_other_seed_differs():
    def once(seed: int) -> dict:
        return run_sim(
            SimConfig(
                deployment(hop=0.1), workload="low-effort", num_requests=8, concurrency=4, max_output=200, seed=seed
            )
        ).summary

    a, b, c = once(1), once(1), once(2)
    assert a == b
    assert a["output_throughput_tok_s"] != c["output_throughput_tok_s"]


@pytest.mark.parametrize("policy", ["step-sync", "model-sync", "eager", "std-serving"])
def test_every_policy_completes(policy):
    res = run_sim(SimConfig(deployment(policy=policy, hop=0.2), workload="fixed:16,60", num_requests=8, concurrency=4))
    assert res.summary["requests_completed"] == 8 and res.summary["total_output_tokens"] == 8 * 60


def test_delayed_batches_on_the_large_model_are_at_least_the_threshold():
    res = run_sim(
        SimConfig(
            deployment("delayed", (1, 3), hop=0.3),
            workload="fixed:16,100",
            num_requests=16,
            concurrency=8,
            cost=ConstantCost([6.0, 28.0]),
        )
    )
    sizes = res.metrics.batch_series(1)[2]
    steady_end = res.window[1]
    starts = res.metrics.batch_series(1)[0]
    assert (sizes[starts < steady_end] >= 3).all()  # while 8 are live, B_1 = 3 holds
    assert res.summary["requests_completed"] == 16  # the tail (N < 3) still drains: the guard clamps B


def test_std_serving_pays_per_hop_bookkeeping():
    def run(policy: str, **kw):
        dep = deployment(policy, hop=0.2)
        return run_sim(SimConfig(dep, workload="fixed:64,200", num_requests=16, concurrency=8, **kw))

    std, eager = run("std-serving"), run("eager")
    # Every return to a model that saw the request before is a new request there that re-matches its prefix:
    # each of the H visits to the large model but the 16 first ones, and each way back (but for requests that
    # finish on the large model). Nothing is re-matched when the subservers keep requests pending.
    visits = round(std.summary["hops_mean"] * 16)
    assert 2 * visits - 32 <= std.rematch_rows <= 2 * visits - 16 and eager.rematch_rows == 0
    assert std.summary["output_throughput_tok_s"] < eager.summary["output_throughput_tok_s"]
    # What differs is only what re-matching costs: with steps of a constant price the two modes run alike.
    flat = [run(p, cost=ConstantCost([6.0, 28.0])).summary["output_throughput_tok_s"] for p in ("std-serving", "eager")]
    assert flat[0] == pytest.approx(flat[1])


def _returning_rows(monkeypatch, policy: str) -> list[tuple[int, int]]:
    """(start, tokens) of every row that brings a request back to a model that saw it before."""
    from tokenrouter.sim import subserver

    rows: list[tuple[int, int]] = []
    prepare = subserver.SimSubserver._prepare

    def spy(self, batch, ready_s):
        for r in batch.rows:
            if not r.from_prev and r.num_tokens > 1 and r.start > r.req.prompt_len:
                rows.append((r.start, r.num_tokens))
        return prepare(self, batch, ready_s)

    monkeypatch.setattr(subserver.SimSubserver, "_prepare", spy)
    run_sim(SimConfig(deployment(policy, hop=0.2), workload="fixed:64,200", num_requests=16, concurrency=8))
    monkeypatch.undo()
    return rows


def test_std_serving_re_prefills_a_returning_request_from_its_last_whole_page(monkeypatch):
    # The baseline's prefix cache matches whole pages of 16 tokens: a returning visit extends from a page boundary,
    # so it feeds the part of its last page again on top of what the peer wrote (the routed runtime keeps KV
    # pending and feeds only the latter; its rows start anywhere).
    std, eager = _returning_rows(monkeypatch, "std-serving"), _returning_rows(monkeypatch, "eager")
    assert len(std) > 20 and len(eager) > 20
    assert all(start % 16 == 0 for start, _ in std)
    assert sum(start % 16 != 0 for start, _ in eager) > len(eager) // 2

    def mean(rows):
        return sum(n for _, n in rows) / len(rows)

    assert mean(std) > mean(eager) + 3  # half a page on average


def test_cross_host_links_add_latency():
    def ttft_e2e(placement: str) -> float:
        dep = deployment(placement=placement, hop=0.3)
        dep.scheduler.overlap = False  # with overlap, when a return lands relative to the prepare time is noise
        return run_sim(SimConfig(dep, workload="fixed:16,100", num_requests=8, concurrency=4)).summary["e2e_ms_mean"]

    assert ttft_e2e("cross-host") > ttft_e2e("separate")


def test_mps_colocation_is_slower_than_separate_gpus():
    def thr(placement: str) -> float:
        return run_sim(
            SimConfig(deployment(placement=placement, hop=0.2), workload="fixed:16,200", num_requests=16, concurrency=8)
        ).summary["output_throughput_tok_s"]

    assert thr("mps") < thr("separate")


def test_open_loop_poisson_arrivals_complete():
    res = run_sim(SimConfig(deployment(hop=0.1), workload="fixed:16,50", num_requests=20, arrival_rate=50.0))
    assert res.summary["requests_completed"] == 20 and res.window is None


def test_kv_pressure_without_admission_preempts_but_finishes_everything():
    dep = deployment(hop=0.2)
    dep.scheduler.kv_admission = False
    for m in dep.models:
        m.kv_budget_gb = 0.02  # ~170 tokens on the small model, ~75 on the large one
    res = run_sim(SimConfig(dep, workload="fixed:20,40", num_requests=12, concurrency=6))
    assert res.summary["requests_completed"] == 12 and res.preemptions > 0


def test_admission_holds_clients_back_instead_of_preempting():
    dep = deployment(hop=0.2)
    dep.scheduler.kv_growth_tokens = None  # worst-case reservations: nothing can be preempted
    for m in dep.models:
        m.kv_budget_gb = 0.02
    res = run_sim(SimConfig(dep, workload="fixed:20,40", num_requests=12, concurrency=6))
    assert res.summary["requests_completed"] == 12 and res.preemptions == 0
    # 60 tokens per request, ~75 on the large model: one request at a time, the others wait at admission
    assert res.summary["batch_p99_model1"] == 1


def test_trace_router_replays_hops():
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write(json.dumps({"id": "t0", "prompt_len": 8, "runs": [[0, 5], [1, 2], [0, 3]]}) + "\n")
        f.write(json.dumps({"id": "t1", "prompt_len": 8, "runs": [[0, 4]]}) + "\n")
    res = run_sim(SimConfig(deployment(router="trace"), workload=f.name, num_requests=2, concurrency=2))
    df = res.metrics.to_frame().set_index("rid")
    assert df.loc["t0", "output_len"] == 10 and df.loc["t1", "output_len"] == 4
    assert res.summary["tokens_model1"] == 2


def _no_hops(overlap: bool, host_ms: float) -> SimConfig:
    dep = deployment(hop=0.0)
    dep.scheduler.overlap = overlap
    return SimConfig(
        dep, workload="fixed:8,200", num_requests=16, concurrency=4, cost=ConstantCost([5.0, 30.0], sched_ms=host_ms)
    )


def test_host_time_is_visible_without_overlap_and_hidden_with_it():
    n, step, host = 4, 5.0, 1.0
    off = run_sim(_no_hops(False, host))
    assert off.summary["steady_output_throughput_tok_s"] == pytest.approx(n / ((step + host) / 1000), rel=1e-9)
    on = run_sim(_no_hops(True, host))
    # back to back on the device: only the steps where a finished request's successor joins late lose time
    assert on.summary["steady_output_throughput_tok_s"] == pytest.approx(n / (step / 1000), rel=0.03)
    starts, ends, _ = on.metrics.batch_series(0)
    assert (starts[1:] - ends[:-1] < 1e-12).mean() > 0.9  # the next step was prepared while this one ran
    assert off.wasted_rows == 0 and on.wasted_rows == 0  # nobody hops: no prepared row is wasted


def test_overlap_prices_the_rows_a_hop_wastes():
    dep = deployment(hop=0.3)
    res = run_sim(
        SimConfig(dep, workload="fixed:16,100", num_requests=16, concurrency=8, cost=ConstantCost([5.0, 30.0]))
    )
    assert res.summary["requests_completed"] == 16 and res.wasted_rows > 0
    dep.scheduler.overlap = False
    res = run_sim(
        SimConfig(dep, workload="fixed:16,100", num_requests=16, concurrency=8, cost=ConstantCost([5.0, 30.0]))
    )
    assert res.wasted_rows == 0


def test_tune_token_per_row_estimate_matches_r2r_and_rstitch():
    import numpy as np

    from tokenrouter.markov.colocation import tokens_per_row

    p = 0.1
    assert tokens_per_row(np.array([[1 - p, p], [1.0, 0.0]])) == pytest.approx([1.0, 1 / p])
    q = 0.25  # r-stitch: the large runs 4 steps, the small's first step after it feeds 4 tokens
    small, large = tokens_per_row(np.array([[1 - p, p], [q, 1 - q]]))
    assert small == pytest.approx((4 + 10 - 1) / 10) and large == pytest.approx((10 + 4 - 1) / 4)


def _kv_pressure(n: int, admission: bool) -> float:
    # The setting: 1 GB of KV per model (8,719 tokens on the 0.6B, 3,814 on the 32B).
    dep = deployment("eager", hop=0.1)
    dep.scheduler.kv_admission = admission
    for m in dep.models:
        m.kv_budget_gb = 1.0
    cfg = SimConfig(dep, workload="low-effort", num_requests=48, concurrency=n, max_output=600, seed=1)
    return run_sim(cfg).summary["output_throughput_tok_s"]


def test_more_clients_than_the_pools_hold_wait_at_admission_instead_of_thrashing():
    best = max(_kv_pressure(n, True) for n in (4, 6))
    assert _kv_pressure(16, True) >= 0.95 * best
    assert _kv_pressure(16, False) < 0.95 * best  # the same run without admission thrashes: the test can fail


@pytest.mark.parametrize("placement", ["mps", "cross-host"])
def test_a_tune_table_runs_to_the_end_in_the_simulator(placement):
    """The issue's B(N) table: the peers learn every admission (with link delay across hosts) and the run
    drains with no max_wait to rescue it."""
    dep = deployment("delayed", hop=0.3, placement=placement)
    dep = dataclasses.replace(
        dep, policy=dep.policy.with_thresholds(dep.policy.thresholds, {1: [1, 1], 3: [1, 3], 8: [8, 1]})
    )
    res = run_sim(SimConfig(dep, workload="fixed:16,60", num_requests=24, concurrency=8, seed=2))
    assert res.summary["requests_completed"] == 24


@pytest.mark.parametrize("short_ms", [3.0, 2.5, 1.5])
def test_overlap_sees_a_step_that_ends_before_its_estimate_at_the_next_poll_slice(short_ms):
    """As the runtime: step k+1 is formed at the estimate of k's end (a moving average of GPU times), and a k that
    ends earlier is seen at the next `PREPARE_POLL_S` slice of the wait that began when k started. Steps alternate
    10 ms and `short_ms`: the average (about 6-7 ms) overshoots every short step, which is then seen at the first
    slice boundary after its end, and undershoots every long one, after which the next runs back to back."""
    import math

    from tokenrouter.core.overlap import PREPARE_POLL_S

    calls = []

    def small(b: int) -> float:
        calls.append(b)
        return 10.0 if len(calls) % 2 else short_ms

    cost = ConstantCost([small, 30.0])
    res = run_sim(SimConfig(deployment(hop=0.0), workload="fixed:8,200", num_requests=8, concurrency=4, cost=cost))
    starts, ends, _ = res.metrics.batch_series(0)
    poll_ms = PREPARE_POLL_S * 1e3
    seen_ms = math.ceil(short_ms / poll_ms) * poll_ms
    assert len(starts) % 2 == 0
    assert (ends[-1] - starts[0]) * 1e3 == pytest.approx(len(starts) // 2 * (10.0 + seen_ms), rel=1e-9)
