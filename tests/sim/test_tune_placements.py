"""`trsim tune --placements`: each layout tuned with its own B, the choice by total or per-GPU throughput, on
profiles built here so that the right answer is known without the code under test:
- co-location made ruinous (every co-running pass 4x slower) and tensor parallelism useless (all-reduces of
  0.2 ms, 128 a step: tp=2 is slower than tp=1): only `separate` runs both models at full speed side by side, so it
  must win on total throughput. (Interference alone is not enough: delayed batching can hold the small model while
  the large one steps, B = (1, N), so a faster tp=2 large model beside the small one can still win.)
- no co-location cost at all: MPS on one GPU runs as fast as separate GPUs on half the GPUs, so it must win per
  GPU; and the large model at tp=2 beside the small one is strictly faster than anything at tp=1, so `tp` must win
  on total.
And where the Markov model applies (no co-location), its prediction for a tp=2 model matches the simulator.
Across GPU kinds, references computed without the code under test: a deployment that names its own GPU's profile
for every model simulates exactly as one that names none; a model's prices on another kind are that kind's
profile's alone; USD per million tokens is the hand formula."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from tokenrouter.calibration.analytic import generate
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.gpus import load_gpu_prices, usd_per_hour
from tokenrouter.calibration.profile import AllReduceInfo, MpsInfo, load_profile
from tokenrouter.calibration.step_stats import PartStats, StepStats
from tokenrouter.cli import trsim
from tokenrouter.core.config import (
    DeploymentConfig,
    ModelConfig,
    PlacementConfig,
    PolicyConfig,
    RouterConfig,
    SchedulerConfig,
)
from tokenrouter.deploy.placement import gpu_kinds, on_kinds
from tokenrouter.models import load_spec
from tokenrouter.sim.decide import THROUGHPUT, Choice, Trial
from tokenrouter.sim.propose import propose
from tokenrouter.sim.run import SimConfig, run_sim
from tokenrouter.sim.tune import Candidate, TunePoint, choose, simulate_thresholds

FAST = ["--workload", "fixed:16,64", "--top", "1", "--hop-rate", "0.2"]


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        trsim.main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def profile_file(tmp_path: Path, slowdown: float, allreduce: AllReduceInfo | None) -> Path:
    prof = generate(["qwen3-0.6b", "qwen3-32b"])
    prof = msgspec.structs.replace(prof, mps=MpsInfo(default_slowdown=slowdown, pairs={}), allreduce=allreduce)
    return prof.save(tmp_path / f"slow{slowdown}.json")


def tune(tmp_path: Path, capsys, slowdown: float, objective: str, allreduce: AllReduceInfo | None = None,
         n: int = 4) -> tuple[dict, str]:  # fmt: skip
    out = tmp_path / f"{slowdown}-{objective}.yaml"
    prof = profile_file(tmp_path, slowdown, allreduce)
    rc, text, err = call(["tune", "--profile", str(prof), "--placements", "mps,separate,tp", "--num-gpus", "2",
                          "--objective", objective, *FAST, "-n", str(n), "--num-requests", str(4 * n), "-o", str(out)],
                         capsys)  # fmt: skip
    assert rc == 0, err
    return yaml.safe_load(out.read_text()), text


def layout_of(cfg: dict) -> tuple[str, list[list[int]], list[int]]:
    return cfg["placement"]["mode"], [m["gpus"] for m in cfg["models"]], [m["tp"] for m in cfg["models"]]


def test_ruinous_colocation_makes_separate_win_on_total(tmp_path, capsys):
    cfg, text = tune(tmp_path, capsys, 4.0, "total", AllReduceInfo(latency_ms=0.2, bus_bandwidth_gbs=100.0), n=8)
    assert layout_of(cfg) == ("separate", [[0], [1]], [1, 1])
    note = cfg["notes"]["placements"]
    assert note["chosen"] == "separate" and [c["candidate"] for c in note["candidates"]] == ["mps", "separate", "tp"]
    by = {c["candidate"]: c for c in note["candidates"]}
    assert by["separate"]["sim_tok_s"] > max(by["mps"]["sim_tok_s"], by["tp"]["sim_tok_s"])
    assert [by[k]["gpus"] for k in ("mps", "separate", "tp")] == [1, 2, 2]
    assert "candidates at N=8" in text and cfg["policy"]["table"]  # the table of all candidates; B per N written


def test_free_colocation_makes_mps_win_per_gpu_and_tp_win_on_total(tmp_path, capsys):
    per_gpu, _ = tune(tmp_path, capsys, 1.0, "per-gpu")
    assert layout_of(per_gpu) == ("mps", [[0], [0]], [1, 1])
    total, text = tune(tmp_path, capsys, 1.0, "total")
    assert layout_of(total) == ("mps", [[0], [0, 1]], [1, 2])
    chosen = next(c for c in total["notes"]["placements"]["candidates"] if c["candidate"] == "tp")
    assert chosen["estimated"] and "ESTIMATED" in text  # the tp=2 numbers are estimates, and the user is told
    by = {c["candidate"]: c for c in per_gpu["notes"]["placements"]["candidates"]}
    assert by["mps"]["sim_tok_s_per_gpu"] == pytest.approx(by["mps"]["sim_tok_s"])
    assert by["tp"]["sim_tok_s_per_gpu"] == pytest.approx(by["tp"]["sim_tok_s"] / 2)


def _candidate(label: str, gpus: int, tok_s: float) -> Candidate:
    return Candidate(label, None, [_point(tok_s)], gpus)  # type: ignore[arg-type]


def _point(tok_s: float) -> TunePoint:
    """N = 8 where one B, (1, 2), was simulated at `tok_s`."""
    return TunePoint(8, Choice(8, (1, 2), {(1, 2): Trial((1, 2), tok_s, 5.0, 6.0)}, [], THROUGHPUT))


def test_choice_by_objective_and_ties_go_to_fewer_gpus():
    a, b, c = _candidate("mps", 1, 1000.0), _candidate("separate", 2, 1500.0), _candidate("tp", 2, 2000.0)
    assert choose([a, b, c], 8, "total") is c and choose([a, b, c], 8, "per-gpu") is a
    tie = _candidate("separate", 2, 1000.0)
    assert choose([tie, a], 8, "total") is a  # same throughput on fewer GPUs


@pytest.mark.parametrize("argv", [["--placements", "mps", "--gpus", "0,1"], ["--placements", "tp", "--num-gpus", "1"],
                                  ["--placements", "moon"], ["--placements", "mps", "--objective", "most"],
                                  ["--placements", "mps", "--tp", "1,2"]])  # fmt: skip
def test_bad_placement_flags_are_one_line_errors(argv, capsys, tmp_path):
    rc, _, err = call(["tune", *argv, *FAST, "-n", "4", "-o", str(tmp_path / "x.yaml")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("tp", [1, 2])
def test_markov_matches_the_simulator_for_a_model_on_its_own_gpus(tp):
    """Separate GPUs (no co-location, which the chain only approximates), overlap off, decode-heavy requests: the
    Markov model's throughput at its B* is the simulator's within 5%, whether the large model's step times are
    measured (tp=1) or estimated (tp=2): both read the same cost model."""
    dep = DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b", gpus=list(range(1, 1 + tp)), tp=tp)],
        placement=PlacementConfig("separate"),
        policy=PolicyConfig("delayed", [1, 1]),
        router=RouterConfig("r2r", hop_rate=0.2),
        scheduler=SchedulerConfig(overlap=False),
    )
    cfg = SimConfig(dep, workload="fixed:16,400", num_requests=24, concurrency=4, seed=3)
    best, predicted = propose(cfg, 4).ranked[0]
    sim = simulate_thresholds(cfg, best).summary["steady_output_throughput_tok_s"]
    assert sim == pytest.approx(predicted, rel=0.05)


# -- across GPU kinds and prices: each model priced from its own GPU's profile, the cost objective, refusals ----


def _pair(mode: str, profile: str | None = None) -> DeploymentConfig:
    models = [ModelConfig("qwen3-0.6b", profile=profile), ModelConfig("qwen3-32b", gpus=[1], profile=profile)]
    return DeploymentConfig(models=models, placement=PlacementConfig(mode), policy=PolicyConfig("delayed", [1, 4]),
                            router=RouterConfig("r2r", hop_rate=0.2))  # fmt: skip


@pytest.mark.parametrize("mode", ["separate", "cross-host"])
def test_naming_the_deployments_own_profile_per_model_simulates_the_same(mode):
    runs = [run_sim(SimConfig(_pair(mode, p), workload="fixed:16,64", num_requests=16, concurrency=4)).summary
            for p in (None, "h200")]  # fmt: skip
    assert runs[0] == runs[1]


def test_same_kind_pair_is_cross_host_on_the_deployment_profile():
    dep = on_kinds(_pair("separate"), ("h200", "h200"))
    assert dep.placement.mode == "cross-host" and [m.profile for m in dep.models] == [None, None]
    assert [m.kv_budget_gb for m in dep.models] == [None, None] and gpu_kinds(dep) == ["h200", "h200"]


def test_each_model_is_priced_from_its_own_gpu_profile():
    h200, l4 = load_profile("h200"), load_profile("l4")
    cost = CostModel(h200, "cross-host", models=["qwen3-0.6b", "qwen3-32b"], profiles=[l4, None])
    stats = StepStats(graph=PartStats(8, 8, 0, 8 * 500))
    assert cost.for_model(0).step_ms(stats) == CostModel(l4).for_model("qwen3-0.6b").step_ms(stats)
    assert cost.for_model(1).step_ms(stats) == CostModel(h200).for_model("qwen3-32b").step_ms(stats)
    assert cost.for_model(0).step_ms(stats) > 5 * CostModel(h200).for_model("qwen3-0.6b").step_ms(stats)
    assert any("ESTIMATED (l4" in n for n in cost.notes()) and not cost.measured
    dep = on_kinds(_pair("separate"), ("l4", "h200"))
    assert [m.profile for m in dep.models] == ["l4", None] and gpu_kinds(dep) == ["l4", "h200"]
    # the small model's KV: what its weights leave of 90% of the L4's 24 GB
    assert dep.models[0].kv_budget_gb == pytest.approx(24 * 0.9 - _weights_gb("qwen3-0.6b"), abs=0.005)


def _weights_gb(name: str) -> float:
    return load_spec(name).weight_bytes / 1e9


def _priced(label: str, gpus: int, tok_s: float, usd_hour: float) -> Candidate:
    return Candidate(label, None, [_point(tok_s)], gpus, usd_per_hour=usd_hour)  # type: ignore[arg-type]


def test_cost_ranking_matches_the_hand_computation():
    prices = load_gpu_prices("h200=4,l4=0.5")
    cheap = _priced("l4+h200", 2, 1800.0, usd_per_hour(["l4", "h200"], prices))
    fast = _priced("separate", 2, 2400.0, usd_per_hour(["h200", "h200"], prices))
    one = _priced("mps", 1, 1500.0, usd_per_hour(["h200"], prices))
    # USD/Mtok = $/h / (tok/s x 3600) x 1e6
    assert cheap.usd_per_mtok(8) == pytest.approx(4.5 / (1800 * 3600) * 1e6)  # 0.694
    assert fast.usd_per_mtok(8) == pytest.approx(8.0 / (2400 * 3600) * 1e6)  # 0.926
    assert one.usd_per_mtok(8) == pytest.approx(4.0 / (1500 * 3600) * 1e6)  # 0.741
    assert choose([fast, one, cheap], 8, "cost") is cheap and choose([fast, one, cheap], 8, "total") is fast


@pytest.mark.parametrize(
    ("argv", "says"),
    [(["--placements", "tpu+h200"], "unknown GPU kind 'tpu'"),
     (["--placements", "mps,l4+h200", "--gpu-prices", "l4=0.5"], "no price for h200"),
     (["--placements", "l4+l4"], "qwen3-32b at tp=1 needs"),
     (["--placements", "mps", "--gpu-prices", "moon=1"], "unknown GPU kind 'moon'"),
     (["--placements", "mps", "--objective", "cost"], "needs --gpu-prices")],
)  # fmt: skip
def test_bad_kinds_prices_and_misfits_are_one_line_errors(argv, says, capsys, tmp_path):
    rc, _, err = call(["tune", *argv, *FAST, "-n", "4", "-o", str(tmp_path / "x.yaml")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err, err


def test_table_prices_candidates_and_marks_estimates(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the whole table on one line per row
    out = tmp_path / "t.yaml"
    rc, text, err = call(["tune", "--placements", "mps,l4+h200", "--gpu-prices", "h200=4,l4=0.5", "--objective",
                          "cost", *FAST, "-n", "4", "--num-requests", "16", "-o", str(out)], capsys)  # fmt: skip
    assert rc == 0, err
    assert "USD/Mtok" in text and "TPOT p50" in text and "ESTIMATED" in text
    assert "ESTIMATED (l4 from h200" in text  # the estimated profile's label, printed in full below the tables
    notes = {c["candidate"]: c for c in yaml.safe_load(out.read_text())["notes"]["placements"]["candidates"]}
    assert notes["l4+h200"]["usd_per_hour"] == 4.5 and notes["mps"]["usd_per_hour"] == 4.0
    assert notes["l4+h200"]["estimated"] and not notes["mps"]["estimated"]
    assert notes["mps"]["usd_per_mtok"] == pytest.approx(4.0 / (notes["mps"]["sim_tok_s"] * 3600) * 1e6, rel=1e-3)
