"""Markov-chain throughput model (docs/markov.md): hand-checkable cases, two independent cross-checks (the
post-launch chain of docs/markov.md, written out naively here, and a small event simulation) and the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import scipy.sparse as sp
import typer
from chain_reference import event_simulation, post_launch_reference
from typer.testing import CliRunner

import tokenrouter.markov.explore as explore_mod
import tokenrouter.markov.solve as solve_mod
from tokenrouter.cli.model_cmd import model as model_command
from tokenrouter.markov import (
    MarkovModel,
    feasible_thresholds,
    quantize_steps,
    r2r_preset,
    rstitch_preset,
    stationary_distribution,
    throughput,
)

L0, L1 = 6.0, 27.9


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------------------------------------- hand-checkable


@pytest.mark.parametrize("n", [1, 3, 5])
def test_never_hop_one_batch_every_step(n: int) -> None:
    res = throughput([L0, L1], *r2r_preset(0.0), thresholds=(1, 1), concurrency=n)
    assert rel(res.throughput_tok_s, 1000 * n / L0) < 1e-12
    assert res.mean_batch == pytest.approx((n, 0.0))
    assert res.busy_fraction == pytest.approx((1.0, 0.0))


@pytest.mark.parametrize("n", [1, 2])
def test_always_hop_r2r_alternates(n: int) -> None:
    # All requests move together: small step (token dropped), large step (token committed), repeat.
    model = MarkovModel.create([L0, L1], *r2r_preset(1.0), concurrency=n)
    res = model.throughput((1, 1))
    assert rel(res.throughput_tok_s, 1000 * n / (L0 + L1)) < 1e-12
    assert res.busy_fraction == pytest.approx((L0 / (L0 + L1), L1 / (L0 + L1)))
    chain = model.chain((1, 1))  # periodic (period 2): the direct solve must still find pi
    assert chain.transition.shape[0] == 2
    assert np.allclose(chain.pi, [0.5, 0.5])


@pytest.mark.parametrize("p", [0.1, 0.35, 0.8])
def test_single_request_renewal_reward_r2r(p: float) -> None:
    # One small step per cycle, plus a large step with probability p; exactly one token per cycle.
    res = throughput([L0, L1], *r2r_preset(p), thresholds=(1, 1), concurrency=1)
    assert rel(res.throughput_tok_s, 1000 / (L0 + p * L1)) < 1e-10


@pytest.mark.parametrize(("p", "q"), [(0.2, 0.5), (0.35, 0.25), (0.9, 1.0)])
def test_single_request_renewal_reward_rstitch(p: float, q: float) -> None:
    # Cycle = one small step; with prob. p a Geometric(q) run on the large model, every large token committed.
    res = throughput([L0, L1], *rstitch_preset(p, q), thresholds=(1, 1), concurrency=1)
    expected = 1000 * ((1 - p) + p / q) / (L0 + p * L1 / q)
    assert rel(res.throughput_tok_s, expected) < 1e-10


def test_two_closed_classes_are_weighted_by_absorption() -> None:
    # Model 0 sends its single request to model 1 or 2 for good: long-run rate 1/2 * 1/L1 + 1/2 * 1/L2.
    routing = [[0, 0.5, 0.5], [0, 1, 0], [0, 0, 1]]
    res = throughput([1.0, 2.0, 5.0], routing, np.ones((3, 3)), (1, 1, 1), concurrency=1, delta_ms=1.0)
    assert rel(res.throughput_tok_s, 1000 * (0.5 / 2 + 0.5 / 5)) < 1e-12
    assert res.mean_batch == (0.0, 1.0, 1.0)


# ------------------------------------------------------------------------------------------ batch-dependent L(b)


def test_batch_dependent_constant_equals_scalar() -> None:
    pr, c = r2r_preset(0.35)
    base = throughput([L0, L1], pr, c, (1, 2), concurrency=4)
    for steps in ([lambda b: L0, lambda b: L1], [[L0] * 4, [L1] * 6]):
        res = throughput(steps, pr, c, (1, 2), concurrency=4)
        assert res.throughput_tok_s == pytest.approx(base.throughput_tok_s, rel=1e-12)
        assert res.mean_batch == pytest.approx(base.mean_batch)


def test_batch_dependent_hand_checks() -> None:
    small = [2.0 + 0.5 * b for b in range(1, 5)]  # L0(b), b = 1..4
    large = [20.0 + 2.0 * b for b in range(1, 5)]
    res = throughput([small, large], *r2r_preset(0.0), (1, 1), concurrency=4)
    assert rel(res.throughput_tok_s, 1000 * 4 / small[3]) < 1e-12
    res = throughput([small, large], *r2r_preset(1.0), (2, 1), concurrency=2)
    assert rel(res.throughput_tok_s, 1000 * 2 / (small[1] + large[1])) < 1e-12


# --------------------------------------------------------------------------------------- feasibility and inputs


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_feasible_set_two_models(n: int) -> None:
    cands = feasible_thresholds(2, n)
    assert len(cands) == n * (n + 1) // 2
    brute = [b for b in itertools.product(range(1, n + 1), repeat=2) if sum(x - 1 for x in b) < n]
    assert cands == brute


def test_feasible_set_three_models() -> None:
    assert len(feasible_thresholds(3, 3)) == 10  # (e0, e1, e2) >= 0 with sum <= 2
    assert len(feasible_thresholds(3, 1)) == 1


@pytest.mark.parametrize("bad", [(4, 2), (3, 3), (0, 1), (5, 1), (1,), (1, 2, 1), (1.5, 1)])
def test_infeasible_thresholds_raise(bad: tuple) -> None:
    with pytest.raises(ValueError):
        throughput([L0, L1], *r2r_preset(0.3), bad, concurrency=4)


def test_invalid_inputs_raise() -> None:
    pr, c = r2r_preset(0.3)
    with pytest.raises(ValueError):
        r2r_preset(1.2)
    with pytest.raises(ValueError):
        rstitch_preset(0.3, -0.1)
    with pytest.raises(ValueError):
        throughput([L0, 0.0], pr, c, (1, 1), concurrency=2)
    with pytest.raises(ValueError):
        throughput([L0, L1], pr, c, (1, 1), concurrency=0)
    with pytest.raises(ValueError):
        throughput([L0, L1], [[0.5, 0.6], [1, 0]], c, (1, 1), concurrency=2)
    with pytest.raises(ValueError):
        throughput([[L0, L0], L1], pr, c, (1, 1), concurrency=3)  # L(b) table too short


def test_quantization_gcd_is_exact_and_rounding_reported() -> None:
    q = quantize_steps([L0, L1], concurrency=2, delta_ms=0.1)
    assert q.gcd == 3 and q.delta_eff_ms == pytest.approx(0.3) and q.max_step_error_ms == 0.0
    pr, c = r2r_preset(0.35)
    ts = [throughput([L0, L1], pr, c, (1, 2), concurrency=3, delta_ms=d).throughput_tok_s for d in (0.1, 0.05, 0.3)]
    assert ts == pytest.approx([ts[0]] * 3, rel=1e-12)
    q = quantize_steps([6.04, L1], concurrency=2, delta_ms=0.1)
    assert q.max_step_error_ms == pytest.approx(0.04)
    assert quantize_steps([0.01, 1.0], concurrency=1, delta_ms=0.1).quanta[0, 1] == 1  # at least one quantum


# ------------------------------------------------------------------------------------------ probability & chain


@pytest.mark.parametrize(("p", "q", "b"), [(0.35, 1.0, (1, 1)), (0.35, 1.0, (2, 2)), (0.6, 0.3, (1, 3))])
def test_probability_conservation(p: float, q: float, b: tuple[int, int]) -> None:
    chain = MarkovModel.create([L0, L1], *rstitch_preset(p, q), concurrency=5).chain(b)
    t = chain.transition
    assert np.allclose(np.asarray(t.sum(axis=1)).ravel(), 1.0)
    assert chain.pi.min() >= 0 and chain.pi.sum() == pytest.approx(1.0)
    assert np.abs(t.T @ chain.pi - chain.pi).max() < 1e-12
    # Every embedded state is a completion instant: some running model has residual 0.
    assert (((chain.b > 0) & (chain.r == 0)).any(axis=1)).all()


def test_tuple_state_keys_match_packed_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Large M or N overflow the packed int64 key; the tuple fallback must give the same chain.
    model = MarkovModel.create([L0, L1], *rstitch_preset(0.4, 0.5), concurrency=4)
    packed = model.evaluate(feasible_thresholds(2, 4))
    monkeypatch.setattr(explore_mod, "_INT_KEY_LIMIT", 0.0)
    tupled = model.evaluate(feasible_thresholds(2, 4))
    assert [r.throughput_tok_s for r in tupled] == pytest.approx([r.throughput_tok_s for r in packed], rel=1e-12)
    assert [r.n_states for r in tupled] == [r.n_states for r in packed]


def test_stationary_distribution_generic_periodic_matrix() -> None:
    t = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float))
    assert np.allclose(stationary_distribution(t), [1 / 3] * 3)
    assert np.allclose(solve_mod._power_iteration(t), [1 / 3] * 3)  # the fallback copes with periodicity


def test_transient_start_with_two_closed_classes() -> None:
    # Two requests: each independently ends on model 1 or model 2 forever (3 absorbing configurations).
    routing = [[0, 0.5, 0.5], [0, 1, 0], [0, 0, 1]]
    res = throughput([1.0, 2.0, 5.0], routing, np.ones((3, 3)), (1, 1, 1), concurrency=2, delta_ms=1.0)
    # both on 1: 2/2 per ms; both on 2: 2/5; split: 1/2 + 1/5 (probabilities 1/4, 1/4, 1/2)
    expected = 1000 * (0.25 * 1.0 + 0.25 * 0.4 + 0.5 * 0.7)
    assert rel(res.throughput_tok_s, expected) < 1e-12


# ------------------------------------------- independent check 1: docs/markov.md's post-launch chain, naively


@pytest.mark.parametrize("n", [2, 3])
def test_matches_post_launch_reference_two_models(n: int) -> None:
    pr, c = rstitch_preset(0.35, 0.6)
    model = MarkovModel.create([2.0, 9.3], pr, c, concurrency=n, delta_ms=0.1)
    for b, res in zip(feasible_thresholds(2, n), model.best_thresholds().results, strict=True):
        ref = post_launch_reference([20, 93], pr, c, b, n) * 10_000  # per 0.1 ms -> per s
        assert rel(res.throughput_tok_s, ref) < 1e-9


def test_matches_post_launch_reference_three_models() -> None:
    pr = np.array([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]])
    c = np.array([[1, 0, 1], [1, 0.5, 0], [2, 1, 0]], dtype=float)
    for b in [(1, 1, 1), (2, 1, 1), (1, 2, 2)]:
        res = throughput([2.0, 3.0, 7.0], pr, c, b, concurrency=3, delta_ms=1.0)
        assert rel(res.throughput_tok_s, post_launch_reference([2, 3, 7], pr, c, b, 3) * 1000) < 1e-9


# ------------------------------------------------------------ independent check 2: event simulation, 2 percent


def test_matches_event_simulation() -> None:
    pr, c = r2r_preset(0.35)
    for b in [(1, 3), (1, 1)]:
        exact = throughput([L0, L1], pr, c, b, concurrency=4).throughput_tok_s
        sim = event_simulation([60, 279], pr, c, b, 4, 30_000) * 10_000
        assert rel(sim, exact) < 0.02


def test_best_thresholds_table() -> None:
    search = MarkovModel.create([L0, L1], *r2r_preset(0.35), concurrency=4).best_thresholds()
    assert [res.thresholds for res in search.results] == feasible_thresholds(2, 4)
    top = max(res.throughput_tok_s for res in search.results)
    assert search.best_throughput_tok_s == top
    assert search.ranked()[0].thresholds == search.best


# --------------------------------------------------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("model")(model_command)

    @app.callback()
    def main() -> None:  # a callback keeps `model` a named subcommand, as in `trsim`
        pass

    return app


BASE = ["model", "--step-ms", "6.0,27.9", "--hop-rate", "0.35", "--concurrency", "4"]


def test_cli_single_thresholds_last_line_is_number() -> None:
    out = CliRunner().invoke(_app(), [*BASE, "--thresholds", "1,3", "--delta-ms", "0.1"])
    assert out.exit_code == 0, out.output
    value = float(out.stdout.strip().splitlines()[-1])
    expected = throughput([L0, L1], *r2r_preset(0.35), (1, 3), concurrency=4).throughput_tok_s
    assert value == pytest.approx(expected, abs=0.01)


def test_cli_step_table_matches_constant_steps(tmp_path) -> None:
    table = tmp_path / "steps.json"
    table.write_text(json.dumps({"step_ms": [[L0] * 4, [L1] * 4]}))
    args = ["model", "--hop-rate", "0.35", "--concurrency", "4", "--thresholds", "1,3"]
    with_table = CliRunner().invoke(_app(), [*args, "--step-ms-table", str(table)])
    plain = CliRunner().invoke(_app(), [*args, "--step-ms", f"{L0},{L1}"])
    assert with_table.exit_code == 0, with_table.output
    assert with_table.stdout.splitlines()[-1] == plain.stdout.splitlines()[-1]


def test_cli_search_ends_with_best() -> None:
    out = CliRunner().invoke(_app(), [*BASE, "--return-prob", "0.5"])
    assert out.exit_code == 0, out.output
    last = out.stdout.strip().splitlines()[-1]
    search = MarkovModel.create([L0, L1], *rstitch_preset(0.35, 0.5), concurrency=4).best_thresholds()
    b, t = last.split()
    assert b == "B*=" + ",".join(map(str, search.best))
    assert float(t.removeprefix("T=")) == pytest.approx(search.best_throughput_tok_s, abs=0.01)


@pytest.mark.parametrize(
    "args",
    [
        ["model", "--step-ms", "6.0,27.9", "--hop-rate", "1.5", "--concurrency", "4"],
        [*BASE, "--thresholds", "4,2"],
        [*BASE, "--thresholds", "1,2,3"],
        ["model", "--step-ms", "6.0,27.9,3.0", "--hop-rate", "0.3", "--concurrency", "4"],
        ["model", "--step-ms", "6.0,-1", "--hop-rate", "0.3", "--concurrency", "4"],
        ["model", "--step-ms", "6.0,27.9", "--hop-rate", "0.3", "--concurrency", "0"],
        ["model", "--step-ms", "6.0,x", "--hop-rate", "0.3", "--concurrency", "4"],
        [*BASE, "--return-prob", "-0.2"],
        [*BASE, "--delta-ms", "0"],
        ["model", "--hop-rate", "0.3", "--concurrency", "4"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args: list[str]) -> None:
    out = CliRunner().invoke(_app(), args)
    assert out.exit_code == 2
    assert "Traceback" not in out.output
    assert len(out.stderr.strip().splitlines()) == 1
