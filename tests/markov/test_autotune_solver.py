"""Autotune's Markov solve: for given estimates it answers what the Markov model built by hand answers (B*, T(B*),
T of the B in force), and reads the routers' hand-off semantics right."""

from __future__ import annotations

import pytest

from tokenrouter.core.autotune import Estimates, StepLine
from tokenrouter.core.config import (
    AutotuneConfig,
    ConfigError,
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    RouterConfig,
)
from tokenrouter.core.hop_law import hop_law
from tokenrouter.deploy.autotune_controller import make_controller
from tokenrouter.markov import MarkovModel, r2r_preset, rstitch_preset, search_thresholds
from tokenrouter.markov.autotune_solve import CoRun, MarkovSolver


def line(a: float, c: float = 0.0) -> StepLine:
    return StepLine(a, c, 0.5 * a, (1.0, 8.0))


@pytest.mark.parametrize(("p", "n", "current"), [(0.35, 4, (1, 1)), (0.05, 6, (1, 4)), (0.2, 8, (2, 3))])
def test_r2r_solve_is_the_markov_search_on_the_estimates(p, n, current):
    est = Estimates(n, (p, 0.99), (line(6.0, 0.1), line(27.9)), 400.0)
    sol = MarkovSolver("r2r", max_states=50_000)(est, current)
    P, C = r2r_preset(p)  # the large model's estimate (0.99) is not used: R2R hands back after one token
    model = MarkovModel.create([lambda b: 6.0 + 0.1 * b, 27.9], P, C, n, 0.1, 400.0)
    ref = search_thresholds(model, 50_000)
    assert sol.thresholds == ref.thresholds
    assert sol.throughput_tok_s == pytest.approx(ref.throughput_tok_s)
    assert sol.current_tok_s == pytest.approx(ref.model.throughput(current).throughput_tok_s)


def test_rstitch_uses_the_estimated_hand_back_and_an_assumption_until_it_is_seen():
    est = Estimates(4, (0.3, 0.25), (line(6.0), line(27.9)), None)
    sol = MarkovSolver("r-stitch", return_prob=1.0)(est, (1, 1))
    P, C = rstitch_preset(0.3, 0.25)
    ref = search_thresholds(MarkovModel.create([6.0, 27.9], P, C, 4, 0.1, None))
    assert sol.thresholds == ref.thresholds and sol.throughput_tok_s == pytest.approx(ref.throughput_tok_s)
    unseen = MarkovSolver("r-stitch", return_prob=0.5).matrices((0.3, None))
    assert unseen[0] == pytest.approx(rstitch_preset(0.3, 0.5)[0])


def test_infeasible_current_b_is_compared_as_the_scheduler_clamps_it():
    est = Estimates(3, (0.35, 1.0), (line(6.0), line(27.9)), None)
    sol = MarkovSolver("r2r")(est, (1, 7))  # (1, 7) at N = 3: every subserver runs (1, 3)
    P, C = r2r_preset(0.35)
    ref = MarkovModel.create([6.0, 27.9], P, C, 3, 0.1).throughput((1, 3)).throughput_tok_s
    assert sol.current_tok_s == pytest.approx(ref)


def test_which_hand_offs_drop_the_token():
    assert hop_law("r2r", 2).drops_token == (True, False)
    assert hop_law("r-stitch", 2, return_prob=0.5).drops_token == (True, False)
    assert hop_law("me", 3).drops_token == (True, True, False)


def _dep(router: str = "r2r", policy: str = "delayed", models: int = 2) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b")] * (models - 1) + [ModelConfig("qwen3-32b")],
        policy=PolicyConfig(policy, [1] * models if policy == "delayed" else [], autotune=AutotuneConfig()),
        router=RouterConfig(router, hop_rate=0.2),
    )


def test_make_controller_follows_the_deployment():
    ctrl = make_controller(_dep())
    assert ctrl.policy.thresholds == (1, 1) and ctrl.estimator.drops == (True, False)
    assert ctrl.solve.hop_rate == 0.2 and ctrl.solve.max_states == AutotuneConfig().max_states


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"policy": "step-sync"}, "needs policy delayed or eager"), ({"router": "trace"}, "Markov model describes"),
     ({"router": "r2r", "models": 3}, "Markov model describes")],
)  # fmt: skip
def test_deployments_autotune_cannot_drive_are_refused(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        _dep(**kw)


def test_over_the_budget_at_n_it_compares_at_half_n_and_scales_back():
    """With a budget too small for any chain at N = 8, the gain is judged at N = 4: B*(4) against the B in force
    scaled to 4, and B*(4) is scaled back to 8 (as the search scales)."""
    est = Estimates(8, (0.35, 1.0), (line(6.0), line(27.9)), 400.0)
    sol = MarkovSolver("r2r", max_states=300)(est, (1, 2))
    assert "compared at N=4" in sol.note
    P, C = r2r_preset(0.35)
    at4 = MarkovModel.create([6.0, 27.9], P, C, 4, 0.1, 400.0)
    b4 = tuple(int(x) for x in sol.note.split("compared at N=4: B*=")[1].split(" ")[0].split(","))
    assert sol.thresholds == tuple(1 if x == 1 else round(x * 2) for x in b4)
    # the search may settle on a coarser quantum (within 2% per step): throughputs within a few percent
    assert sol.current_tok_s == pytest.approx(at4.throughput((1, 1)).throughput_tok_s, rel=0.03)
    assert sol.throughput_tok_s == pytest.approx(at4.throughput(b4).throughput_tok_s, rel=0.03)


def test_without_interference_the_colocated_solve_is_the_plain_search():
    """Co-location factors of 1 change nothing: the per-B re-pricing must give the search's own answer."""
    est = Estimates(6, (0.15, 0.99), (line(1.0, 0.05), line(18.0, 0.4)), 400.0)
    plain = MarkovSolver("r2r")(est, (1, 1))
    flat = MarkovSolver("r2r", corun=CoRun([lambda own, u, p: 1.0, lambda own, u, p: 1.0]))(est, (1, 1))
    assert flat.thresholds == plain.thresholds
    assert flat.throughput_tok_s == pytest.approx(plain.throughput_tok_s, rel=0.02)


def test_the_colocated_solve_reprices_the_small_models_steps_per_b():
    """The small model's steps, measured at B = (1,1) (large model busy most of the time), are slowed 3x while the
    large one runs. Priced as measured, holding the large model looks no better; de-mixed and re-priced per B, a B
    that keeps the large model idle more often gains, and the B in force is priced as measured."""
    corun = CoRun([lambda own, u, p: (1 - u) + 3.0 * u, None])
    est = Estimates(8, (0.1, 0.99), (line(2.5, 0.05), line(18.0, 0.4)), 400.0)
    aware = MarkovSolver("r2r", corun=corun)(est, (1, 1))
    P, C = r2r_preset(0.1)
    measured = MarkovModel.create(est.step_table(8), P, C, 8, 0.1, 400.0)
    assert aware.current_tok_s == pytest.approx(measured.throughput((1, 1)).throughput_tok_s, rel=0.03)
    assert aware.thresholds[1] > 1 and aware.throughput_tok_s > aware.current_tok_s * 1.05
