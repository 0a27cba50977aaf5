"""The simulator and the Markov model implement the same semantics; with geometric hops, constant step
times, zero message latency and overlap off (one batch per model at a time, as the chain assumes) they must
agree (within sampling noise of a finite run)."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.cost import ConstantCost
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig, SchedulerConfig
from tokenrouter.markov import r2r_preset, rstitch_preset, throughput
from tokenrouter.sim.run import SimConfig, run_sim

STEP_MS = [6.0, 27.9]


@pytest.mark.parametrize(
    ("hop", "n", "b", "ret"),
    [
        (0.1, 4, (1, 1), 1.0),
        (0.35, 4, (1, 3), 1.0),
        (0.2, 8, (1, 4), 1.0),
        (0.5, 6, (2, 3), 1.0),
        (0.2, 6, (1, 3), 0.5),  # R-Stitch-like geometric run on the large model
    ],
)
def test_des_matches_markov_within_2_percent(hop, n, b, ret):
    router = "r2r" if ret == 1.0 else "r-stitch"
    dep = DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")],
        policy=PolicyConfig("delayed", list(b)),
        router=RouterConfig(router, hop_rate=hop, return_prob=ret),
        scheduler=SchedulerConfig(overlap=False),
    )
    res = run_sim(
        SimConfig(dep, workload="fixed:16,400", num_requests=40 * n, concurrency=n, seed=3, cost=ConstantCost(STEP_MS))
    )
    P, C = r2r_preset(hop) if ret == 1.0 else rstitch_preset(hop, ret)
    predicted = throughput(STEP_MS, P, C, b, n, delta_ms=0.1).throughput_tok_s
    assert res.summary["steady_output_throughput_tok_s"] == pytest.approx(predicted, rel=0.02)
