"""`trsim tune` on the ME ensemble: the Markov model (with completions) ranks thresholds as the simulator does,
and the tuned B is the simulator's best of the candidates (constant steps, so the two can agree)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenrouter.calibration.cost import ConstantCost
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig
from tokenrouter.sim.propose import propose
from tokenrouter.sim.run import SimConfig
from tokenrouter.sim.tune import simulate_thresholds, tune_point

ME_MS = [0.9, 4.6, 17.0]
N = 4


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> SimConfig:
    path = Path(tmp_path_factory.mktemp("me")) / "geo.jsonl"
    lengths = np.random.default_rng(5).geometric(1 / 20, 250 * N)
    path.write_text("".join(json.dumps({"prompt_len": 16, "output_len": int(o)}) + "\n" for o in lengths))
    dep = DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-1.7b"), ModelConfig("qwen3-32b")],
        policy=PolicyConfig("delayed", [1, 1, 1]),
        router=RouterConfig("me"),
    )
    return SimConfig(dep, workload=str(path), num_requests=250 * N, concurrency=N, seed=3, cost=ConstantCost(ME_MS))


def simulated(cfg: SimConfig, b: tuple[int, ...]) -> float:
    return simulate_thresholds(cfg, b).summary["steady_output_throughput_tok_s"]


def test_markov_ranks_me_thresholds_as_the_simulator(cfg: SimConfig) -> None:
    pred = propose(cfg, N)
    assert pred.note == ""  # N = 4 with three models is an exact search
    predicted = dict(pred.ranked)
    best, best_tok_s = pred.ranked[0]
    picks = [(1, 1, 1), (2, 2, 1), (4, 1, 1), best]
    sim = {b: simulated(cfg, b) for b in picks}
    for a in picks:
        for b in picks:
            if sim[a] > 1.05 * sim[b]:  # a clear difference in the simulator: the model must order them alike
                assert predicted[a] > predicted[b], (a, b, sim, predicted)
    assert sim[best] >= 0.98 * max(sim.values())
    # Eager ME falls out of lockstep: the model that knows it no longer ties eager with the best.
    assert predicted[(1, 1, 1)] < 0.8 * best_tok_s


def test_tune_picks_the_best_simulated_candidate(cfg: SimConfig) -> None:
    point = tune_point(cfg, N, top=3)
    assert point.best != (1, 1, 1)
    assert point.best_throughput == max(point.simulated.values())
    assert point.simulated[point.markov[0]] >= 0.98 * point.best_throughput
