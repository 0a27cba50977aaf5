"""The Markov model under MPS co-location: a B solved at its own co-location fixed point (`colocated_at`), and
autotune under MPS against the discrete-event simulator, which applies the measured co-run factors pass by pass."""

from __future__ import annotations

import dataclasses

from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig
from tokenrouter.markov.colocation import peer_load, tokens_per_row
from tokenrouter.sim.propose import colocated_at, routing_matrices
from tokenrouter.sim.run import SimConfig
from tokenrouter.sim.tune import simulate_thresholds


def _cfg(n: int) -> SimConfig:
    dep = DeploymentConfig(
        models=[ModelConfig(name="qwen3-0.6b", gpus=[0]), ModelConfig(name="qwen3-32b", gpus=[0])],
        policy=PolicyConfig(kind="delayed", thresholds=[1, 1]),
        router=RouterConfig(name="r2r", hop_rate=0.1),
        profile="h200-measured",
    )
    return SimConfig(dep, workload="low-effort", num_requests=48, concurrency=n, seed=0)


def test_the_fixed_point_reproduces_its_own_load():
    cfg = _cfg(8)
    res = colocated_at(cfg, (1, 6), 8)
    P, _ = routing_matrices(cfg)
    again = colocated_at(cfg, (1, 6), 8, load=peer_load(res, tokens_per_row(P)))
    assert abs(again.throughput_tok_s / res.throughput_tok_s - 1) < 0.02
    assert abs(again.busy_fraction[1] - res.busy_fraction[1]) < 0.03


def test_autotune_under_mps_leaves_a_b_that_overloads_the_shared_gpu():
    """The live H200 study's failure, in the simulator: started at (1,2), autotune used to stay there (its solve
    priced every B with the interference measured at (1,2)). Now it moves to a B the simulator itself runs faster."""
    from tokenrouter.core.config import AutotuneConfig
    from tokenrouter.sim.run import run_sim

    cfg = _cfg(8)
    tune = AutotuneConfig(observe_s=1.0, interval_s=3.0, hold_s=3.0, half_life_s=3.0, min_steps=20)
    pol = dataclasses.replace(cfg.deployment.policy, thresholds=[1, 2], autotune=tune)
    run = SimConfig(dataclasses.replace(cfg.deployment, policy=pol), workload="low-effort", num_requests=160,
                    concurrency=8, seed=0, max_output=256)  # fmt: skip
    res = run_sim(run)
    changes = res.extra["autotune"]["changes"]
    assert changes, res.extra["autotune"]["status"]
    final = tuple(changes[-1]["new"])
    assert final[1] > 2
    static = dataclasses.replace(run, num_requests=96)
    assert (simulate_thresholds(static, final).summary["steady_output_throughput_tok_s"]
            > simulate_thresholds(static, (1, 2)).summary["steady_output_throughput_tok_s"])  # fmt: skip


def test_a_candidate_is_simulated_as_given_even_from_a_tuned_config_with_a_table():
    # `trsim tune --config serve.yaml` on a config a previous tune wrote: its B(N) table must not replace the
    # candidates (every candidate would then run the table's B).
    plain = _cfg(8)
    table = PolicyConfig(kind="delayed", thresholds=[1, 1], table={1: [1, 1], 8: [1, 2]})
    tuned = dataclasses.replace(plain, deployment=dataclasses.replace(plain.deployment, policy=table))
    want = simulate_thresholds(plain, (1, 6)).summary["steady_output_throughput_tok_s"]
    assert simulate_thresholds(tuned, (1, 6)).summary["steady_output_throughput_tok_s"] == want
    assert tuned.deployment.policy.table  # the caller's config is left as it was
