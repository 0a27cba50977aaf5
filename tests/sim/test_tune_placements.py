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
profile's alone; USD per million tokens is the hand formula. Cost across placements is compared at the load each
one sustains within the TPOT SLO, on hand-made points whose winner and price are worked out in the comments."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml
from rich.console import Console

from tokenrouter.calibration.analytic import generate
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.gpus import load_gpu_prices, usd_per_hour
from tokenrouter.calibration.profile import AllReduceInfo, MpsInfo
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.calibration.step_stats import PartStats, StepStats
from tokenrouter.cli import trsim
from tokenrouter.cli.tune_cmd import candidates_table
from tokenrouter.core.config import (
    DeploymentConfig,
    ModelConfig,
    PlacementConfig,
    PolicyConfig,
    RouterConfig,
    SchedulerConfig,
)
from tokenrouter.core.names import TuneObjective
from tokenrouter.models import load_spec
from tokenrouter.sim.decide import THROUGHPUT, Choice, Objective, Trial
from tokenrouter.sim.propose import propose
from tokenrouter.sim.run import SimConfig, run_sim
from tokenrouter.sim.tune import Candidate, TunePoint, choose, simulate_thresholds
from tokenrouter.sim.tune_layouts import gpu_kinds, on_kinds, tuned_config

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
     (["--placements", "mps", "--objective", "cost"], "needs --gpu-prices"),
     (["--placements", "mps", "--objective", "cost", "--gpu-prices", "h200=4", "--compare-n", "4"],
      "--compare-n applies to --objective total")],
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
    # no SLO, one N: each priced at it, and the table says so
    assert "priced at N" in text and "no TPOT SLO" in text and notes["mps"]["priced_at_N"] == 4


# -- cost at the load each placement sustains within the SLO (hand-made points) ----------------------------------

SLO = Objective(50.0)


def _at(n: int, tok_s: float, p99: float, objective: Objective = SLO) -> TunePoint:
    """N where one B, (1, 2), was simulated at `tok_s` and TPOT p99 `p99` ms: chosen when it meets the SLO."""
    t = Trial((1, 2), tok_s, p99 / 2, p99)
    return TunePoint(n, Choice(n, (1, 2) if objective.meets(t) else None, {(1, 2): t}, [], objective))


def _swept(label: str, mode: str, gpus: int, usd_hour: float, rows: dict[int, tuple[float, float]],
           objective: Objective = SLO) -> Candidate:  # fmt: skip
    points = [_at(n, tok, p99, objective) for n, (tok, p99) in rows.items()]
    return Candidate(label, _pair(mode), points, gpus, usd_per_hour=usd_hour)


# one H200 at $4/h under MPS meets 50 ms up to N = 16 (its sweep stopped at the miss at 32); two at $8/h up to 64
MPS = {8: (1500.0, 10.0), 16: (2000.0, 30.0), 32: (2200.0, 60.0)}
SEPARATE = {8: (1800.0, 8.0), 16: (3200.0, 12.0), 32: (5000.0, 20.0), 64: (6000.0, 45.0)}
NEVER = {8: (9000.0, 70.0)}  # the cheapest tokens of all at N = 8, but over the SLO already there


def test_one_n_and_sustained_load_pick_different_winners_and_sustained_load_decides():
    mps, sep = _swept("mps", "mps", 1, 4.0, MPS), _swept("separate", "separate", 2, 8.0, SEPARATE)
    # at N = 8: MPS 4/(1500 x 3600) x 1e6 = 0.741 USD/Mtok, two GPUs 8/(1800 x 3600) x 1e6 = 1.235: MPS
    assert choose([mps, sep], 8, "cost") is mps
    assert mps.usd_per_mtok(8) == pytest.approx(0.7407, abs=1e-4) and sep.usd_per_mtok(8) == pytest.approx(
        1.2346, abs=1e-4
    )
    # at the load each sustains: MPS at N = 16, 4/(2000 x 3600) x 1e6 = 0.556; two GPUs at N = 64, 8/(6000 x 3600) x
    # 1e6 = 0.370: two GPUs, 33% cheaper
    assert (mps.sustained_n, sep.sustained_n) == (16, 64)
    assert choose([mps, sep], None, "cost") is sep
    assert sep.usd_per_mtok(64) == pytest.approx(0.3704, abs=1e-4) and mps.usd_per_mtok(16) == pytest.approx(
        0.5556, abs=1e-4
    )
    # per GPU is cost at one price per GPU: 1,500 against 900 at N = 8, 2,000 against 3,000 where each sustains
    assert choose([mps, sep], 8, "per-gpu") is mps and choose([mps, sep], None, "per-gpu") is sep


def test_without_an_slo_each_is_priced_at_the_largest_n():
    # the same tok/s at N = 64 with no SLO: MPS 4/(2300 x 3600) x 1e6 = 0.483 (TPOT 120 ms counts for nothing), two
    # GPUs 0.370
    mps = _swept("mps", "mps", 1, 4.0, {64: (2300.0, 120.0)}, THROUGHPUT)
    sep = _swept("separate", "separate", 2, 8.0, {64: (6000.0, 45.0)}, THROUGHPUT)
    assert (mps.sustained_n, sep.sustained_n) == (64, 64) and choose([mps, sep], None, "cost") is sep
    assert mps.usd_per_mtok(64) == pytest.approx(0.4831, abs=1e-4)


def test_a_candidate_that_never_meets_the_slo_ranks_last_and_is_marked(monkeypatch):
    mps, sep = _swept("mps", "mps", 1, 4.0, MPS), _swept("separate", "separate", 2, 8.0, SEPARATE)
    never = _swept("l4+h200", "cross-host", 2, 4.5, NEVER)  # 4.5/(9000 x 3600) x 1e6 = 0.139 USD/Mtok at N = 8
    assert never.sustained_n is None
    assert choose([never, mps], None, "cost") is mps and choose([never, sep, mps], None, "cost") is sep
    worse = _swept("h100+h100", "cross-host", 2, 6.0, {8: (9000.0, 90.0)})
    assert choose([worse, never], None, "cost") is never  # none meets it: the lower TPOT p99 at the smallest N
    monkeypatch.setenv("COLUMNS", "250")
    con = Console(record=True, width=250)
    con.print(candidates_table([mps, sep, never], sep, None, TuneObjective.COST))
    text = con.export_text()
    rows = {line.split("│")[1].strip(): [x.strip() for x in line.split("│")[1:-1]]
            for line in text.splitlines() if line.startswith("│")}  # fmt: skip
    assert "priced at N" in text and "TPOT p99 <= 50 ms" in text and "highest N of 8,16,32,64" in text
    assert rows["mps"][3] == "16" and rows["separate"][3] == "64" and rows["l4+h200"][3] == "-"
    assert rows["separate"][7] == "0.370" and rows["mps"][7] == "0.556"
    assert "chosen" in rows["separate"][-1] and "SLO missed at N=8, ranked last" in rows["l4+h200"][-1]


def test_the_config_records_the_choice_the_slo_and_each_sustained_n():
    mps, sep = _swept("mps", "mps", 1, 4.0, MPS), _swept("separate", "separate", 2, 8.0, SEPARATE)
    never = _swept("l4+h200", "cross-host", 2, 4.5, NEVER)
    dep = tuned_config(sep, [mps, sep, never], 8, TuneObjective.COST, workload="low-effort", num_gpus=2,
                       placements=True, splits=False)  # fmt: skip
    note = dep.notes["placements"]
    assert note["chosen"] == "separate" and note["slo_tpot_ms_p99"] == 50.0 == dep.notes["slo_tpot_ms_p99"]
    assert "compared_at_N" not in note and "TPOT p99 <= 50 ms" in note["compared"]
    by = {c["candidate"]: c for c in note["candidates"]}
    assert [by[k]["sustained_N"] for k in ("mps", "separate", "l4+h200")] == [16, 64, None]
    assert [by[k]["sim_tok_s"] for k in ("mps", "separate")] == [2000.0, 6000.0]
    assert by["separate"]["usd_per_mtok"] == pytest.approx(0.3704, abs=1e-4)
    assert by["mps"]["usd_per_mtok"] == pytest.approx(0.5556, abs=1e-4)
    assert by["l4+h200"]["priced_at_N"] is None and not by["l4+h200"]["meets_slo"]
    assert dep.policy.table == {n: [1, 2] for n in (8, 16, 32, 64)}


def test_no_placement_meeting_the_slo_is_said_and_the_lowest_tpot_is_written(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "slo.yaml"
    rc, text, err = call(["tune", "--placements", "mps,separate", "--gpu-prices", "h200=4", "--objective", "cost",
                          "--slo-tpot-ms", "0.5", *FAST, "-n", "2,4", "-o", str(out)], capsys)  # fmt: skip
    assert rc == 0, err
    note = yaml.safe_load(out.read_text())["notes"]["placements"]
    by = {c["candidate"]: c for c in note["candidates"]}
    assert [by[k]["priced_at_N"] for k in ("mps", "separate")] == [None, None]  # TPOT of 0.5 ms: never met
    assert [by[k]["numbers_at_N"] for k in ("mps", "separate")] == [2, 2]  # each sweep stopped at its first N
    low = min(by.values(), key=lambda c: (c["tpot_ms_p50_p99"][1], c["gpus"]))
    assert note["chosen"] == low["candidate"] and note["slo_tpot_ms_p99"] == 0.5
    assert "ranked last" in text and "no candidate meets TPOT p99 <= 0.5 ms at any N" in text


def test_the_tune_table_says_why_a_markov_prediction_is_missing(capsys, tmp_path):
    """N = 16's chain does not fit the proposal budget (its B* is scaled from N = 8 without a prediction): the
    table prints '-' for it and a caption saying why; N = 2 alone gets a number and no caption."""
    out = {}
    for n in ("2", "2,16"):
        rc, text, _ = call(["tune", *FAST, "-n", n, "-o", str(tmp_path / "t.yaml")], capsys)
        assert rc == 0
        out[n] = text
    why = "Markov tok/s -: the chain of its B* does not fit the proposal budget"
    assert why not in out["2"] and why in " ".join(out["2,16"].split())
    row16 = next(line for line in out["2,16"].splitlines() if line.strip("│ ").startswith("16 "))
    assert row16.split("│")[3].strip() == "-"
