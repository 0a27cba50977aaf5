"""`trsim tune` with several candidates: each is tuned at the N they are compared at and only the chosen one at
every N, and the simulator checks spread over processes. References: the chosen candidate tuned alone at every N
(what the tune did before it skipped the others' other N), and the same point tuned in this process. Where cost is
compared at the load each candidate sustains, the decider is replaced by a table of hand-made points, so which N
are tuned, and in which order, is known without the simulator."""

from __future__ import annotations

import pytest

from tokenrouter.cli import trsim
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, TuneObjective
from tokenrouter.deploy.overrides import DeploymentOverrides, resolve_deployment
from tokenrouter.sim import tune_layouts
from tokenrouter.sim.decide import THROUGHPUT, Choice, Objective, Trial
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.simulate import sim_config
from tokenrouter.sim.tune import TunePoint, tune_point
from tokenrouter.sim.tune_layouts import (
    candidate_specs,
    points_to_tune,
    tune_and_choose,
    tune_candidates,
)

TUNE = dict(workload="fixed:16,64", num_requests=8, top=1, seed=0, max_output=None)


def flags() -> DeploymentConfig:
    """The deployment a tune starts from (`trsim tune --hop-rate 0.2`: delayed, B to choose)."""
    return resolve_deployment(None, DeploymentOverrides(hop_rate=0.2, policy="delayed"))


def test_only_the_chosen_candidate_is_tuned_beyond_the_compared_n():
    deploy = flags()
    specs = candidate_specs([Layout.MPS, Layout.SEPARATE], [None], deploy, 2)
    seen: list[tuple[str, int]] = []
    progress = lambda label, n, done: seen.append((label, n)) if done else None  # noqa: E731
    best, cands = tune_and_choose(deploy, specs, [2, 4, 8], 4, TuneObjective.TOTAL, progress=progress, **TUNE)
    assert best in cands and [c.label for c in cands] == ["mps", "separate"]
    assert len(seen) == points_to_tune(2, 3) == 4
    others = [c for c in cands if c is not best]
    assert [p.concurrency for c in others for p in c.points] == [4]
    assert [p.concurrency for p in best.points] == [2, 4, 8]
    alone = tune_candidates(deploy, [specs[cands.index(best)]], [2, 4, 8], **TUNE)[0]
    for got, ref in zip(best.points, alone.points, strict=True):
        assert (got.concurrency, got.best, got.simulated) == (ref.concurrency, ref.best, ref.simulated)
    assert best.deployment == alone.deployment


def test_a_rows_b_is_what_its_n_tuned_alone_chooses():
    """Each N's search starts from nothing of another N (seeded with the previous N's B, the search at N = 64 once
    stopped on a ridge where `trsim run`'s own found a B 5.4% faster live): the row of N = 8 in a tune of 2, 4, 8 is
    the row of a tune of 8 alone, after the same search (the B scouted and judged)."""
    deploy = flags()
    spec = candidate_specs([Layout.MPS], [None], deploy, 2)
    sweep = tune_candidates(deploy, spec, [2, 4, 8], **TUNE)[0].points[-1]
    alone = tune_candidates(deploy, spec, [8], **TUNE)[0].points[-1]
    assert sorted(sweep.choice.scouted) == sorted(alone.choice.scouted)
    assert (sweep.concurrency, sweep.best, sweep.simulated) == (alone.concurrency, alone.best, alone.simulated)


def test_the_choice_is_by_the_objective_at_the_compared_n():
    deploy = flags()
    specs = candidate_specs([Layout.MPS, Layout.SEPARATE], [None], deploy, 2)
    _, total = tune_and_choose(deploy, specs, [4], 4, TuneObjective.TOTAL, **TUNE)
    tok_s = {c.label: c.throughput(4) for c in total}
    per_gpu = {c.label: c.per_gpu(4) for c in total}
    best_total, _ = tune_and_choose(deploy, specs, [4], 4, TuneObjective.TOTAL, **TUNE)
    best_per_gpu, _ = tune_and_choose(deploy, specs, [4], 4, TuneObjective.PER_GPU, **TUNE)
    assert best_total.label == max(tok_s, key=tok_s.get)
    assert best_per_gpu.label == max(per_gpu, key=per_gpu.get)


def test_a_pool_of_processes_gives_the_numbers_of_one_process():
    cfg, _ = sim_config(flags(), concurrency=4, workload="fixed:16,64", num_requests=8)
    here = tune_point(cfg, 4, top=2)
    with sim_pool(2) as pool:
        assert pool is not None
        there = tune_point(cfg, 4, top=2, pool=pool)
    assert (there.best, there.simulated, there.tpot_ms) == (here.best, here.simulated, here.tpot_ms)


def test_one_job_runs_in_this_process():
    with sim_pool(1) as pool:
        assert pool is None


def test_negative_jobs_is_a_one_line_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        trsim.main(["tune", "--jobs", "-1", "-o", str(tmp_path / "x.yaml")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--jobs must be >= 0" in err and "Traceback" not in err


def test_a_compare_n_not_tuned_is_a_one_line_error_before_anything_runs(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        trsim.main(["tune", "-n", "2,4", "--compare-n", "8", "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--compare-n 8 must be one of --concurrency 2,4" in err
    assert len(err.strip().splitlines()) == 1


# -- cost at the load each candidate sustains: which N are tuned -------------------------------------------------

# (tok/s, TPOT p99 ms) of the one B each hand-made point simulates: MPS on one GPU meets a 50 ms SLO up to N = 16,
# two GPUs up to N = 64. A higher N only raises TPOT, as the sweep assumes.
ROWS = {
    "mps": {8: (1500.0, 10.0), 16: (2000.0, 30.0), 32: (2200.0, 60.0), 64: (2300.0, 120.0)},
    "separate": {8: (1800.0, 8.0), 16: (3200.0, 12.0), 32: (5000.0, 20.0), 64: (6000.0, 45.0)},
}
NS = [8, 16, 32, 64]


@pytest.fixture
def tuned(monkeypatch) -> list[tuple[str, int]]:
    """The decider replaced by ROWS; returns the (placement, N) points tuned, in order."""
    calls: list[tuple[str, int]] = []

    def fake(cfg, n, *, objective=THROUGHPUT, **_) -> TunePoint:
        mode = str(cfg.deployment.placement.mode)
        tok_s, p99 = ROWS[mode][n]
        t = Trial((1, 2), tok_s, p99 / 2, p99)
        calls.append((mode, n))
        return TunePoint(n, Choice(n, (1, 2) if objective.meets(t) else None, {(1, 2): t}, [], objective))

    monkeypatch.setattr(tune_layouts, "tune_point", fake)
    return calls


def _cost(usd: list[float], target: Objective = THROUGHPUT, compare_n: int = 8):
    deploy = flags()
    specs = candidate_specs([Layout.MPS, Layout.SEPARATE], [None], deploy, 2)
    return tune_and_choose(deploy, specs, NS, compare_n, TuneObjective.COST, usd=usd, target=target, **TUNE)


def test_under_an_slo_each_candidate_is_swept_upward_and_stops_at_its_first_miss(tuned):
    # one H200 at $4/h, two at $8/h. At N = 8 MPS is cheaper (4/(1500 x 3600) x 1e6 = 0.741 against 8/(1800 x 3600)
    # x 1e6 = 1.235 USD/Mtok); at the load each sustains within 50 ms, MPS at N = 16 costs 4/(2000 x 3600) x 1e6 =
    # 0.556 and two GPUs at N = 64 cost 8/(6000 x 3600) x 1e6 = 0.370: two GPUs win.
    best, cands = _cost([4.0, 8.0], Objective(50.0))
    assert tuned == [("mps", 8), ("mps", 16), ("mps", 32), *(("separate", n) for n in NS)]  # MPS never at 64
    assert best.label == "separate" and [c.sustained_n for c in cands] == [16, 64]
    assert best.usd_per_mtok(best.sustained_n) == pytest.approx(8 / (6000 * 3600) * 1e6)
    assert [p.concurrency for p in best.points] == NS


def test_the_chosen_candidate_is_tuned_past_its_miss_for_its_table_but_priced_where_it_sustains(tuned):
    # MPS at $1/h: 1/(2000 x 3600) x 1e6 = 0.139 USD/Mtok at N = 16 beats two GPUs' 0.370 at N = 64
    best, _ = _cost([1.0, 8.0], Objective(50.0))
    assert best.label == "mps" and tuned[-1] == ("mps", 64) and tuned.count(("mps", 64)) == 1
    assert [p.concurrency for p in best.points] == NS and not best.point(64).meets_slo
    assert best.sustained_n == 16  # N = 64 was tuned after the choice, for the B(N) table: it does not count
    assert points_to_tune(2, 4, sweep=True) == 8 >= len(tuned)


def test_without_an_slo_cost_tunes_every_candidate_at_the_largest_n_only(tuned):
    # no SLO: every N is sustained, so each is priced at N = 64: MPS 4/(2300 x 3600) x 1e6 = 0.483, two GPUs 0.370
    best, cands = _cost([4.0, 8.0])
    assert tuned == [("mps", 64), ("separate", 64), ("separate", 8), ("separate", 16), ("separate", 32)]
    assert best.label == "separate" and [c.sustained_n for c in cands] == [64, 64]
    assert len(tuned) == points_to_tune(2, 4)


def test_total_throughput_still_compares_at_the_compare_n(tuned):
    best, _ = tune_and_choose(flags(), candidate_specs([Layout.MPS, Layout.SEPARATE], [None], flags(), 2),
                              NS, 8, TuneObjective.TOTAL, target=Objective(50.0), **TUNE)  # fmt: skip
    assert tuned[:2] == [("mps", 8), ("separate", 8)] and best.label == "separate"  # 1,800 > 1,500 tok/s at N = 8
