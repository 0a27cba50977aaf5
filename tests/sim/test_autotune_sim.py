"""`trsim run --autotune` with a shifting workload: the simulator's clients and router follow the phases, and the
controller (the core's, fed by the simulated counters) moves B to what the Markov search gives for the new regime,
computed here independently from the known step times, hop rate and N.

Constant step times, zero message latency and overlap off: the regime in which the simulator and the Markov model
agree (`test_des_vs_markov.py`), so the search's answer is the right target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenrouter.calibration.cost import ConstantCost
from tokenrouter.core.config import (
    AutotuneConfig,
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    RouterConfig,
    SchedulerConfig,
)
from tokenrouter.markov import MarkovModel, r2r_preset, search_thresholds
from tokenrouter.sim.run import SimConfig, run_sim

STEP_MS = [6.0, 27.9]
OUTPUT = 400
TUNE = AutotuneConfig(observe_s=1.0, interval_s=5.0, hold_s=5.0, half_life_s=5.0, step_half_life_s=60.0, min_steps=20)


def deployment(b: list[int], hop: float, autotune: AutotuneConfig | None = TUNE) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")],
        policy=PolicyConfig("delayed", b, autotune=autotune),
        router=RouterConfig("r2r", hop_rate=hop),
        scheduler=SchedulerConfig(overlap=False),
    )


def spec(tmp_path: Path, phases: list[dict]) -> str:
    path = tmp_path / "shift.json"
    path.write_text(json.dumps({"workload": f"fixed:16,{OUTPUT}", "phases": phases}))
    return str(path)


def markov(hop: float, n: int) -> MarkovModel:
    P, C = r2r_preset(hop)
    return MarkovModel.create(STEP_MS, P, C, n, 0.1, OUTPUT)


def in_force(res, t: float) -> tuple[int, ...]:
    """The B in force at simulated time t (the last change at or before t)."""
    tune = res.extra["autotune"]
    b = tuple(tune["initial"])
    for c in tune["changes"]:
        if c["at"] <= t:
            b = tuple(c["new"])
    return b


def test_a_hop_rate_shift_moves_b_to_the_markov_optimum_of_the_new_regime(tmp_path):
    wl = spec(tmp_path, [{"at_s": 0, "hop_rate": 0.05}, {"at_s": 30, "hop_rate": 0.35}])
    res = run_sim(SimConfig(deployment([1, 1], 0.05), workload=wl, num_requests=70, concurrency=4, seed=2,
                            cost=ConstantCost(STEP_MS)))  # fmt: skip
    assert res.extra["phases"] == [(0.0, 0.05, None), (30.0, 0.35, None)]
    before = search_thresholds(markov(0.05, 4))
    after = search_thresholds(markov(0.35, 4))
    assert before.thresholds == (1, 1) and after.thresholds == (1, 3)  # the premise: the shift changes B*
    changes = res.extra["autotune"]["changes"]
    assert changes, res.extra["autotune"]["status"]
    assert all(c["at"] > 30 for c in changes)  # (1, 1) was right before the shift: nothing moved
    end = res.window[1]
    assert end > 60  # the steady window runs well past the shift
    assert in_force(res, end) == after.thresholds
    assert len([c for c in changes if c["at"] <= end]) <= 3  # it tracks the estimate's move, it does not flap
    # The schedulers run what the controller decided: large-model batches launched after the change to (1, 3) have
    # at least 3 rows (but for moments when a finish left 3 live requests and the guard lowered B).
    at = next(c["at"] for c in changes if tuple(c["new"]) == (1, 3))
    start, _, size = res.metrics.batch_series(1)
    held = size[(start > at) & (start < end)]
    assert len(held) > 50 and (held >= 3).mean() > 0.95
    before_change = size[(start > 10) & (start < 30)]
    assert before_change.min() == 1  # under (1, 1) single hops ran alone
    last = [c for c in changes if c["at"] <= end][-1]
    assert last["estimates"]["hop_prob"][0] == pytest.approx(0.35, abs=0.05)
    assert last["estimates"]["step_intercept_ms"] == pytest.approx(STEP_MS, rel=1e-6)


def test_an_n_ramp_moves_b_near_the_markov_optimum_for_the_new_n(tmp_path):
    wl = spec(tmp_path, [{"at_s": 0, "concurrency": 2}, {"at_s": 30, "concurrency": 8}])
    dep = deployment(
        [1, 2], 0.35, AutotuneConfig(observe_s=1.0, interval_s=10.0, hold_s=5.0, half_life_s=5.0, min_steps=20)
    )  # N = 8 solves take longest: fewer of them
    res = run_sim(SimConfig(dep, workload=wl, num_requests=70, concurrency=2, seed=3, cost=ConstantCost(STEP_MS)))
    ref8 = markov(0.35, 8)
    best = search_thresholds(ref8)
    assert search_thresholds(markov(0.35, 2)).thresholds == (1, 2)  # B* at N = 2 is where it starts
    assert ref8.throughput((1, 2)).throughput_tok_s < 0.95 * best.throughput_tok_s  # so the ramp matters
    end = res.window[1]
    b = in_force(res, end)
    assert b != (1, 2)
    # (1, 5) and (1, 6) are within 0.3% at N = 8: either is the search's answer up to estimation noise.
    assert ref8.throughput(b).throughput_tok_s >= 0.99 * best.throughput_tok_s, b
    assert all(c["at"] > 30 for c in res.extra["autotune"]["changes"])


def test_phases_move_the_clients_and_the_hop_rate(tmp_path):
    """Without autotune: N follows the phases (requests live at once) and so does the hop rate (share of tokens
    the large model writes: R2R's large model writes one token per hop, so its share is the hop rate)."""
    wl = spec(tmp_path, [{"at_s": 0, "hop_rate": 0.1, "concurrency": 2}, {"at_s": 20, "hop_rate": 0.4,
                                                                          "concurrency": 6}])  # fmt: skip
    # The config says 0.25 and 3 clients: the phase at 0 s replaces both from the start (through the Python API as
    # through `trsim run`).
    res = run_sim(SimConfig(deployment([1, 1], 0.25, autotune=None), workload=wl, num_requests=60, concurrency=3,
                            seed=4, cost=ConstantCost(STEP_MS)))  # fmt: skip
    recs = list(res.metrics.records.values())

    def live_at(t: float) -> int:
        return sum(1 for r in recs if r.arrival <= t < (r.finish or float("inf")))

    assert max(live_at(t / 10) for t in range(1, 200)) == 2
    assert max(live_at(20 + t / 10) for t in range(5, 100)) == 6

    early = [r for r in recs if (r.finish or 0) <= 20]
    late = [r for r in recs if r.arrival >= 21 and r.finish is not None]
    share = lambda rs: sum(r.model_tokens.get(1, 0) for r in rs) / sum(r.output_len for r in rs)  # noqa: E731
    assert share(early) == pytest.approx(0.1, abs=0.03)
    assert share(late) == pytest.approx(0.4, abs=0.04)
    assert "autotune" not in res.extra


def test_the_tuner_does_not_keep_a_stalled_simulation_alive():
    """Nothing moves and no arrival is to come: the tuner stops, so `env.run()` returns (and run_sim reports the
    stall) instead of ticking forever."""
    from types import SimpleNamespace

    import simpy

    from tokenrouter.core.autotune import AutotuneController, Solution
    from tokenrouter.core.autotune_counters import BatchTimes
    from tokenrouter.core.policy import Policy
    from tokenrouter.sim.drivers import STALL_OBSERVES, FinishCounter, SimAutotune

    env = simpy.Environment()
    sub = SimpleNamespace(tokens=0, hops=0, batches=BatchTimes(), sched=SimpleNamespace(is_entry=True, active=3),
                          kick=lambda: None)  # fmt: skip
    ctrl = AutotuneController(TUNE, Policy(), lambda est, cur: Solution(cur, 1.0, 1.0), (True, False))
    tuner = SimAutotune(env, ctrl, PolicyConfig("eager"), [sub, sub], FinishCounter(), finished=lambda: False)
    env.run()
    assert env.now == pytest.approx((STALL_OBSERVES + 1) * TUNE.observe_s) and not tuner.timeline
    env2 = simpy.Environment()
    ticks = {"n": 0}

    def pending() -> bool:  # arrivals still to come for a while: it keeps going
        ticks["n"] += 1
        return ticks["n"] < 50

    SimAutotune(env2, ctrl, PolicyConfig("eager"), [sub, sub], FinishCounter(), finished=lambda: False,
                arrivals_pending=pending)  # fmt: skip
    env2.run()
    assert env2.now == pytest.approx((STALL_OBSERVES + 50) * TUNE.observe_s)
