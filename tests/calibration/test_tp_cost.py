"""A model at tp > 1: the profile's entry at that degree when it has one, else an estimate from the tp=1 entry that
is labelled as such; and the simulator's GPU accounting (a tp=k model occupies k GPUs).

References are independent of `calibration.tensor_parallel`: the analytic generator's own tp model
(`analytic.model_profile(spec, tp=2)`), and limiting cases whose answer is known by hand (no floor and free
all-reduces: exactly half the time; all-reduce latency only: exactly 2 x layers x latency more)."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from tokenrouter.calibration import CostModel, Profile, ProfileError, StepStats, load_profile
from tokenrouter.calibration.analytic import Assumptions, model_profile
from tokenrouter.calibration.tensor_parallel import AllReduceCost, estimate_tp
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig, PolicyConfig, RouterConfig
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.models import load_spec
from tokenrouter.sim.run import SimConfig, run_sim

FREE = AllReduceCost(0.0, 1e12, measured=False)  # no latency, (practically) infinite bandwidth
NO_FLOOR = Assumptions(kernel_us=0.0, graph_launch_ms=0.0, eager_fixed_ms=0.0)


@pytest.fixture(scope="module")
def measured() -> Profile:
    return load_profile("h200")


def _decode(mc, rows: int = 1, context: int = 1024) -> float:
    return mc.step_ms(StepStats.uniform(rows, 1, context, GraphRule()))


def test_estimate_matches_the_analytic_generators_own_tp_model():
    spec, a = load_spec("qwen3-32b"), Assumptions()
    tp1, tp2 = model_profile(spec, tp=1), model_profile(spec, tp=2)
    est = estimate_tp(tp1, spec, 2, AllReduceCost(a.allreduce_ms, 1e12, measured=False)).entry
    for mode in ("graph", "eager"):
        got, want = getattr(est.step, mode), getattr(tp2.step, mode)
        for c in ("c0", "c_ctx", "c_tok", "c_ext", "floor_ms"):
            assert getattr(got, c) == pytest.approx(getattr(want, c), rel=1e-4, abs=1e-9), (mode, c)
        # the analytic row term keeps the fp32 logits traffic whole; the estimate splits the whole row cost
        assert got.c_row <= want.c_row


def test_limiting_cases_of_the_split(measured: Profile):
    spec, entry = load_spec("qwen3-32b"), measured.model("qwen3-32b")
    stats = [StepStats.uniform(b, t, 1024, GraphRule()) for b, t in ((1, 1), (8, 1), (4, 40), (2, 600))]
    cost1 = CostModel(measured, "separate", models=["qwen3-32b"]).for_model(0)
    base = [cost1.step_ms(s) for s in stats]

    def priced(est_entry) -> list[float]:
        prof = msgspec.structs.replace(measured, models={**measured.models, "qwen3-32b@tp2": est_entry})
        return [CostModel(prof, "separate", models=["qwen3-32b"], tp=[2]).for_model(0).step_ms(s) for s in stats]

    halved = priced(estimate_tp(entry, spec, 2, FREE, assumptions=NO_FLOOR).entry)
    assert halved == pytest.approx([b / 2 for b in base], rel=1e-9)
    lat = 0.02
    with_lat = priced(estimate_tp(entry, spec, 2, AllReduceCost(lat, 1e12, measured=False),
                                  assumptions=NO_FLOOR).entry)  # fmt: skip
    assert [w - h for w, h in zip(with_lat, halved, strict=True)] == pytest.approx([2 * spec.num_layers * lat] * 4)


def test_the_estimate_is_used_and_labelled_and_a_measured_entry_wins(measured: Profile):
    cm = CostModel(measured, "mps", models=["qwen3-0.6b", "qwen3-32b"], tp=[1, 2])
    est = cm.for_model(1)
    alone = CostModel(measured, "mps", models=["qwen3-0.6b", "qwen3-32b"]).for_model(1)
    assert est.tp == 2 and "ESTIMATED" in est.estimated and not alone.estimated
    assert _decode(alone) / 2 < _decode(est) < _decode(alone)
    cm.interference(0, 1)
    notes = cm.notes()
    assert len(notes) == 2 and "ESTIMATED" in notes[0] and "ASSUMED" in notes[1]
    assert CostModel(measured, "mps", models=["qwen3-0.6b", "qwen3-32b"]).notes() == []
    # A profile that measured the 32B at tp=2 (a NAME@tp2 entry): that entry is priced, nothing is estimated.
    tp2 = msgspec.structs.replace(measured.model("qwen3-8b"), tp=2)  # an entry that is obviously not the 32B's
    prof = Profile.from_dict({**msgspec.to_builtins(measured),
                              "models": {**msgspec.to_builtins(measured.models), "qwen3-32b@tp2":
                                         msgspec.to_builtins(tp2)}})  # fmt: skip
    mc = CostModel(prof, "separate", models=["qwen3-0.6b", "qwen3-32b"], tp=[1, 2]).for_model(1)
    eight = CostModel(prof, "separate", models=["qwen3-8b"]).for_model(0)
    assert not mc.estimated and _decode(mc) == pytest.approx(_decode(eight))


def test_a_profiles_allreduce_replaces_the_assumption(measured: Profile):
    slow = Profile.from_dict({**msgspec.to_builtins(measured),
                              "allreduce": {"latency_ms": 0.05, "bus_bandwidth_gbs": 100.0}})  # fmt: skip
    default = CostModel(measured, "separate", models=["qwen3-32b"], tp=[2]).for_model(0)
    mc = CostModel(slow, "separate", models=["qwen3-32b"], tp=[2]).for_model(0)
    assert "measured (profile allreduce)" in mc.estimated and "ASSUMED" in default.estimated
    assert _decode(mc) - _decode(default) == pytest.approx(2 * 64 * (0.05 - 0.010), rel=0.01)


def test_tp_keys_and_degrees_are_checked(measured: Profile):
    raw = msgspec.to_builtins(measured)
    bad = {**raw, "models": {**raw["models"], "qwen3-32b@tp2": raw["models"]["qwen3-32b"]}}  # tp: 1 under @tp2
    with pytest.raises(ProfileError, match="NAME@tpK"):
        Profile.from_dict(bad)
    only2 = {**raw, "models": {**raw["models"], "qwen3-32b": {**raw["models"]["qwen3-32b"], "tp": 2}}}
    with pytest.raises(ProfileError, match="tp=2 only"):
        CostModel(Profile.from_dict(only2), "separate", models=["qwen3-32b"]).for_model(0)


def _dep(placement: str, gpus: list[list[int]], tp: list[int]) -> DeploymentConfig:
    return DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b", gpus=gpus[0], tp=tp[0]), ModelConfig("qwen3-32b", gpus=gpus[1], tp=tp[1])],
        placement=PlacementConfig(placement),
        policy=PolicyConfig("delayed", [1, 2]),
        router=RouterConfig("r2r", hop_rate=0.2),
    )


@pytest.mark.parametrize(
    ("placement", "gpus", "tp", "used"),
    [("mps", [[0], [0]], [1, 1], 1), ("separate", [[0], [1]], [1, 1], 2), ("mps", [[0], [0, 1]], [1, 2], 2),
     ("separate", [[0], [1, 2]], [1, 2], 3), ("cross-host", [[0], [0]], [1, 1], 2)],
)  # fmt: skip
def test_gpu_accounting_and_per_gpu_throughput(placement, gpus, tp, used):
    res = run_sim(SimConfig(_dep(placement, gpus, tp), workload="fixed:16,64", num_requests=8, concurrency=4))
    s = res.summary
    assert s["gpus_used"] == used
    assert s["output_throughput_per_gpu_tok_s"] == pytest.approx(s["output_throughput_tok_s"] / used)
    assert bool(res.extra.get("estimated")) == (max(tp) > 1)


def test_the_large_model_at_tp2_on_its_own_gpus_serves_faster():
    def thr(tp: int) -> float:
        dep = _dep("separate", [[0], list(range(1, 1 + tp))], [1, tp])
        return run_sim(SimConfig(dep, workload="fixed:16,128", num_requests=16, concurrency=8)).summary[
            "output_throughput_tok_s"]  # fmt: skip

    assert thr(2) > thr(1)


def test_trsim_cost_and_run_say_what_is_estimated():
    cmd = [sys.executable, "-m", "tokenrouter.cli.trsim"]
    out = subprocess.run([*cmd, "cost", "--model", "qwen3-32b", "--tp", "2"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0 and "ESTIMATED" in out.stdout, out.stderr
    plain = subprocess.run([*cmd, "cost", "--model", "qwen3-32b"], capture_output=True, text=True, timeout=120)
    assert "ESTIMATED" not in plain.stdout
    assert float(out.stdout.splitlines()[-1]) < float(plain.stdout.splitlines()[-1])
    run = subprocess.run([*cmd, "run", "--tp", "1,2", "--workload", "fixed:16,32", "--num-requests", "8", "--json",
                          "-"], capture_output=True, text=True, timeout=120)  # fmt: skip
    rec = json.loads(run.stdout)
    assert rec["tp"] == "1,2" and rec["gpus"] == "0;0,1" and rec["gpus_used"] == 2 and "ESTIMATED" in rec["estimated"]


def test_estimate_refuses_a_base_that_is_not_tp1(measured: Profile):
    entry = msgspec.structs.replace(measured.model("qwen3-32b"), tp=2)
    with pytest.raises(ProfileError, match="tp=2 only"):
        estimate_tp(entry, load_spec("qwen3-32b"), 4, FREE)
