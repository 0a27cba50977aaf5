"""Sync baselines across processes, learned routers and overlap on the tiny pair (real processes, CPU)."""

from __future__ import annotations

import json

import pytest
from rt_helpers import GREEDY, collect, tiny_config, wait_stats

from tokenrouter.calibration.profiler import runtime_costs
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server

PROMPTS = {f"p{k}": [20 + k, 300, 301 + k, 5] for k in range(6)}


def serve(tmp_path, cfg, prompts=PROMPTS, repeat: int = 1, **server_kw):
    """Run `prompts` (each `repeat` times under distinct ids); returns ({rid: Outcome}, server). `server_kw`
    replaces the Server's arguments (default: run directory `tmp_path`, step logs in it)."""
    # A heartbeat far beyond the collect timeout: progress must never wait for it (a subserver that blocks in its
    # poll after its own completion made it launchable again would hang here).
    srv = Server(cfg, **{"run_dir": tmp_path, "step_logs": True, "stats_interval_s": 600.0, **server_kw}).start()
    client = RuntimeClient(srv.addresses)
    try:
        rids = set()
        for r in range(repeat):
            for rid, p in prompts.items():
                client.submit(f"{rid}.{r}", p, GREEDY)
                rids.add(f"{rid}.{r}")
        out = collect(client, rids, timeout_s=50)
        if srv.coordinator is not None:
            runtime_costs.settle(srv.coordinator)  # the last completion reports may still be on their way
    finally:
        client.close()
        srv.stop()
    for rid, o in out.items():
        assert o.end.reason == "length" and o.dup == 0 and sorted(o.tokens) == list(range(GREEDY.max_tokens)), rid
    return out, srv


def steps(srv: Server) -> list[dict]:
    return [json.loads(x) for i in range(2) for x in srv.step_log(i).read_text().splitlines()]


@pytest.mark.parametrize("policy", ["model-sync", "step-sync"])
def test_sync_policies_across_processes(tmp_path, policy):
    out, srv = serve(tmp_path, tiny_config(policy))
    assert any(m == 1 for o in out.values() for _, m in o.tokens.values())  # hops reached the large model
    log = steps(srv)
    assert {s["model"] for s in log} == {0, 1}
    # From the subservers' own timestamps: model-sync never has steps of two models overlapping in time; under
    # step-sync steps of one round may overlap, but a model never starts before the previous round ended
    # (checked through the coordinator's log: launches and completions alternate per round).
    if policy == "model-sync":
        a = [s for s in log if s["model"] == 0]
        b = [s for s in log if s["model"] == 1]
        for x in a:
            for y in b:
                assert x["done"] <= y["launch"] or y["done"] <= x["launch"], (x, y)
    ev = srv.coordinator.log
    running: set[int] = set()
    for e in ev:
        if e.what == "launch":
            assert e.model not in running
            if policy == "model-sync":
                assert not running
            running.add(e.model)
        elif e.what in ("complete", "release"):
            running.discard(e.model)


@pytest.mark.parametrize("policy", ["model-sync", "step-sync"])
def test_sync_policies_pay_at_most_one_coordinator_round_trip_per_step(tmp_path, policy):
    """Counted as `calibration.profiler.runtime_costs.gate_rtts_per_step` counts them (the coordinator's calls), per
    model, against the steps each subserver logged itself: exactly one completion report per step, plus the entry's
    one update when the clients' requests reach it idle. Grants: one per step (nothing is aborted, nothing passed).
    The earlier protocol paid 5-6 calls per step here."""
    _, srv = serve(tmp_path, tiny_config(policy))
    log = steps(srv)
    n = [sum(1 for s in log if s["model"] == i) for i in range(2)]
    coord = srv.coordinator
    assert n[1] > 0 and coord.calls_by_model == [n[0] + 1, n[1]]
    assert coord.grants == n[0] + n[1]
    assert runtime_costs.launched_steps(coord.log) == n[0] + n[1]


@pytest.fixture(scope="module")
def learned_on(tmp_path_factory):
    return serve(tmp_path_factory.mktemp("on"), tiny_config(weights="random", overlap=True), repeat=2)[0]


def test_learned_router_greedy_repeats(learned_on):
    for rid in PROMPTS:  # the same prompt twice in one run: the same tokens and writers
        assert learned_on[f"{rid}.0"].tokens == learned_on[f"{rid}.1"].tokens
    writers = [m for o in learned_on.values() for _, m in o.tokens.values()]
    assert 0 < writers.count(1) < len(writers)  # the calibrated random router hops


def test_overlap_on_and_off_give_the_same_greedy_tokens(tmp_path, learned_on):
    off, _ = serve(tmp_path, tiny_config(weights="random", overlap=False))
    for rid in PROMPTS:
        assert off[f"{rid}.0"].tokens == learned_on[f"{rid}.0"].tokens


@pytest.mark.parametrize("overlap", [True, False])
def test_loop_counters_count_back_to_back_steps(tmp_path, overlap):
    """One request that never hops: after its prefill every step is launched without the loop waiting for work,
    so all but the first step count as back to back, and their periods tile the time between the first and
    the last completion (read from the subserver's own step log)."""
    cfg = tiny_config(hop_rate=0.0, overlap=overlap)
    srv = Server(cfg, run_dir=tmp_path, step_logs=True, stats_interval_s=0.05).start()
    client = RuntimeClient(srv.addresses)
    try:
        client.submit("solo", [20, 300, 301, 5], GREEDY)
        collect(client, {"solo"}, timeout_s=50)
        st = wait_stats(client, lambda s: s[0].steps == GREEDY.max_tokens)[0]
    finally:
        client.close()
        srv.stop()
    log = [json.loads(x) for x in srv.step_log(0).read_text().splitlines()]
    assert len(log) == st.steps == GREEDY.max_tokens
    assert [s["back_to_back"] for s in log] == [False] + [True] * (len(log) - 1)
    # What each step carried: the 4-token prefill, then one fed token a step over a context one longer each time.
    assert [(s["tokens"], s["ext_rows"], s["ext_tokens"]) for s in log] == [(4, 1, 4)] + [(1, 0, 0)] * (len(log) - 1)
    assert [s["ctx"] for s in log] == [4 + k for k in range(len(log))]
    assert [(s["row_tokens"], s["row_ctx"]) for s in log] == [([s["tokens"]], [s["ctx"]]) for s in log]
    assert st.loop_steps == len(log) - 1 and st.loop_rows == len(log) - 1
    assert st.loop_ms == pytest.approx(1e3 * (log[-1]["done"] - log[0]["done"]), rel=1e-6)
    assert st.loop_gpu_ms == 0.0  # CPU: nothing timed


def test_step_logs_in_a_directory_of_their_own_outlive_the_server(tmp_path):
    """`step_logs=DIR` (`tr serve --step-logs`): the logs land in DIR and stay after stop while the run directory
    goes; a DIR that already holds step logs is refused before anything starts."""
    from tokenrouter.steplog import load_step_logs

    logs = tmp_path / "logs"
    out, srv = serve(tmp_path, tiny_config("eager"), run_dir=None, step_logs=logs)
    assert len(out) == len(PROMPTS) and not srv.run_dir.exists()
    back = load_step_logs(logs)
    for k in (0, 1):  # every token a model wrote was sampled by a row of one of its logged steps
        wrote = sum(1 for o in out.values() for _, m in o.tokens.values() if m == k)
        assert wrote > 0 and sum(r["rows"] for r in back[k]) >= wrote
        assert all(r["launch"] <= r["done"] and r["tokens"] == sum(r["row_tokens"]) for r in back[k])
    with pytest.raises(ValueError, match="already holds step logs"):
        Server(tiny_config("eager"), step_logs=logs)
