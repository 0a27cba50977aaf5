"""`trsim tune` with several candidates: each is tuned at the N they are compared at and only the chosen one at
every N, and the simulator checks spread over processes. References: the chosen candidate tuned alone at every N
(what the tune did before it skipped the others' other N), and the same point tuned in this process."""

from __future__ import annotations

import pytest

from tokenrouter.cli import trsim
from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.core.names import Layout, TuneObjective
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.sim_pool import sim_pool
from tokenrouter.sim.simulate import sim_config
from tokenrouter.sim.tune import tune_point
from tokenrouter.sim.tune_layouts import (
    candidate_specs,
    points_to_tune,
    tune_and_choose,
    tune_candidates,
    tuning_flags,
)

TUNE = dict(workload="fixed:16,64", num_requests=8, top=1, seed=0, max_output=None)


def flags() -> DeploymentFlags:
    return tuning_flags(DeploymentFlags(None, DeploymentOverrides(hop_rate=0.2), False))


def test_only_the_chosen_candidate_is_tuned_beyond_the_compared_n():
    deploy = flags()
    specs = candidate_specs([Layout.MPS, Layout.SEPARATE], [None], deploy.resolve(), 2)
    seen: list[tuple[str, int]] = []
    progress = lambda label, n, done: seen.append((label, n)) if done else None  # noqa: E731
    best, cands = tune_and_choose(deploy, specs, [2, 4, 8], 4, TuneObjective.PER_GPU, progress=progress, **TUNE)
    assert best in cands and [c.label for c in cands] == ["mps", "separate"]
    assert len(seen) == points_to_tune(2, 3) == 4
    others = [c for c in cands if c is not best]
    assert [p.concurrency for c in others for p in c.points] == [4]
    assert [p.concurrency for p in best.points] == [2, 4, 8]
    alone = tune_candidates(deploy, [specs[cands.index(best)]], [2, 4, 8], **TUNE)[0]
    for got, ref in zip(best.points, alone.points, strict=True):
        assert (got.concurrency, got.best, got.simulated) == (ref.concurrency, ref.best, ref.simulated)
    assert best.deployment == alone.deployment


def test_the_choice_is_by_the_objective_at_the_compared_n():
    deploy = flags()
    specs = candidate_specs([Layout.MPS, Layout.SEPARATE], [None], deploy.resolve(), 2)
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
