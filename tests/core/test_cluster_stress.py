"""Whole runs on the realistic cluster: 3 models, wire-encoded messages with random delays (order kept per link),
random step times, tokens that depend on what was fed; invariants checked after every event (cluster.py)."""

from __future__ import annotations

import random

import pytest
from cluster import LiveCluster

from tokenrouter.core.policy import Policy
from tokenrouter.routers import ProbRouter

P3 = [[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.6, 0.1, 0.3]]


def router_factory(seed: int, keep_all: bool):
    rng = random.Random(seed)
    keep = [[keep_all or rng.random() < 0.5 for _ in range(3)] for _ in range(3)]
    return lambda: ProbRouter(P3, keep, seed)


def load(c: LiveCluster, seed: int, n: int = 10, prompt: tuple[int, int] = (2, 9), out: tuple[int, int] = (3, 14)):
    rng = random.Random(seed)
    for i in range(n):
        p = [rng.randrange(1, 500) for _ in range(rng.randint(*prompt))]
        c.submit(f"r{i}", p, rng.randint(*out), at=rng.uniform(0.0, 6.0))


POLICIES = {
    "eager": Policy(),
    "delayed": Policy("delayed", table={1: (1, 1, 1), 3: (1, 2, 1), 6: (3, 2, 2), 9: (2, 4, 3)}),
    "model-sync": Policy("model-sync"),
    "step-sync": Policy("step-sync"),
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_runs_keep_every_invariant(policy, overlap, seed):
    c = LiveCluster(router_factory(seed, keep_all=seed % 2 == 0), seed=seed, policy=POLICIES[policy], overlap=overlap)
    load(c, seed)
    c.run()
    assert c.num_launches > 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_tight_pools_preempt_youngest_parked_first_and_finish(overlap, seed):
    # 11 usable pages of 4 tokens per model; a request may grow to 24 tokens (6 pages): pools must evict.
    c = LiveCluster(router_factory(seed, keep_all=False), seed=seed, pages=12, overlap=overlap)
    load(c, seed, n=8, prompt=(4, 10), out=(6, 14))
    c.run()
    assert sum(s.num_preemptions for s in c.scheds) > 0


@pytest.mark.parametrize("seed", range(6))
def test_admission_keeps_tight_pools_from_preempting(seed):
    c = LiveCluster(router_factory(seed, keep_all=False), seed=seed, pages=12, overlap=True, admission=True)
    load(c, seed, n=8, prompt=(4, 10), out=(6, 14))
    c.run()
    assert sum(s.num_preemptions for s in c.scheds) == 0
