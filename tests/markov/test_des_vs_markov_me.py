"""The simulator and the Markov model with completions agree (constant steps, zero latency, long runs).

The workload has geometric output lengths (the model's assumption), so a request's chance to end after each
committed token is the same 1 / mean. ME routing is deterministic: without completions the model is the
lockstep orbit, which the simulator leaves at its first finished request. B = (N, 1, 1) holds the group
together at the entry, except that a finish lowers B_0 to N - 1 until the replacement is admitted.

The cases avoid thresholds whose long-run state is entered only through rare simultaneous finishes (e.g.
B = (2, 1, 1) at N = 4: two pairs alternating, reached when two requests end in one batch): the model gives
that long-run state, while a run of this length still spends a few percent of its window before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenrouter.calibration.cost import ConstantCost
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig, SchedulerConfig
from tokenrouter.markov import me_preset, r2r_preset, throughput
from tokenrouter.sim.run import SimConfig, run_sim

ME_MS = [0.9, 4.6, 17.0]
R2R_MS = [6.0, 27.9]
MEAN_OUTPUT = 20  # short requests: many finishes per run, so the simulated long-run average converges


def geometric_workload(path: Path, num_requests: int, mean: float, seed: int) -> str:
    lengths = np.random.default_rng(seed).geometric(1.0 / mean, num_requests)
    path.write_text("".join(json.dumps({"prompt_len": 16, "output_len": int(o)}) + "\n" for o in lengths))
    return str(path)


def simulate(models: list[str], router: str, b: tuple, n: int, steps: list[float], workload: str, **kw) -> float:
    dep = DeploymentConfig(
        models=[ModelConfig(m) for m in models],
        policy=PolicyConfig("delayed", list(b)),
        router=RouterConfig(router, **kw),
        scheduler=SchedulerConfig(overlap=False),  # the chain has no CPU-GPU overlap: one batch in flight
    )
    cfg = SimConfig(dep, workload=workload, num_requests=10**6, concurrency=n, seed=3, cost=ConstantCost(steps))
    return run_sim(cfg).summary["steady_output_throughput_tok_s"]


ME_MODELS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-32b"]


@pytest.mark.parametrize(
    ("n", "b"),
    [(2, (1, 1, 1)), (4, (1, 1, 1)), (4, (4, 1, 1)), (6, (1, 2, 3)), (8, (1, 3, 4))],
)
def test_me_simulator_matches_model_within_2_percent(tmp_path: Path, n: int, b: tuple) -> None:
    workload = geometric_workload(tmp_path / "geo.jsonl", 250 * n, MEAN_OUTPUT, seed=n)
    simulated = simulate(ME_MODELS, "me", b, n, ME_MS, workload)
    predicted = throughput(ME_MS, *me_preset(3), b, n, mean_output=MEAN_OUTPUT).throughput_tok_s
    assert simulated == pytest.approx(predicted, rel=0.02)


@pytest.mark.parametrize(("hop", "n", "b"), [(0.1, 4, (1, 1)), (0.5, 6, (2, 3))])
def test_r2r_with_completions_matches_simulator(tmp_path: Path, hop: float, n: int, b: tuple) -> None:
    # With R2R only a request finishing on the large model is replaced late, a delay of at most one small
    # step per request: the model with completions stays within 2% of the simulator even for short
    # requests, and within 1% of the model without them at the mean output of tests/sim (400 tokens).
    workload = geometric_workload(tmp_path / "geo.jsonl", 250 * n, MEAN_OUTPUT, seed=n)
    simulated = simulate(["qwen3-0.6b", "qwen3-32b"], "r2r", b, n, R2R_MS, workload, hop_rate=hop)
    pr, c = r2r_preset(hop)
    predicted = throughput(R2R_MS, pr, c, b, n, mean_output=MEAN_OUTPUT).throughput_tok_s
    assert simulated == pytest.approx(predicted, rel=0.02)
    plain = throughput(R2R_MS, pr, c, b, n).throughput_tok_s
    assert throughput(R2R_MS, pr, c, b, n, mean_output=400).throughput_tok_s == pytest.approx(plain, rel=0.01)
