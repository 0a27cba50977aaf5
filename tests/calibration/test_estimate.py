"""Estimated profiles (calibration/estimate.py): identity from the anchor's own GPU, the scaling of each part, memory
fit, the ESTIMATED label, lookups by GPU kind and the `trsim profile` command. References are computed by hand."""

from __future__ import annotations

import json

import pytest

from tokenrouter.calibration import gpus
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.estimate import Scale, estimate_profile, fit_error, fits, profile_label, scale_table
from tokenrouter.calibration.measured import PassTable
from tokenrouter.calibration.profile import ProfileError
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.calibration.step_stats import StepStats
from tokenrouter.cli import trsim

KINDS = ("decode", "varlen", "eager")
TABLE_FIELDS = ("knot_ms", "ctx_ms", "row_ms", "ext_ms", "linear_c0", "linear_c_row", "linear_c_ctx", "linear_c_tok",
                "linear_c_ext")  # fmt: skip


@pytest.fixture(scope="module")
def h200():
    return load_profile("h200")


def test_the_estimate_for_the_anchors_own_gpu_is_the_identity(h200):
    est = estimate_profile(h200, "h200", anchor_name="h200")
    assert est.kind == "estimated"
    for name, m in h200.models.items():
        e = est.models[name]
        assert e.step == m.step and e.host == m.host and e.routers == m.routers
        for kind in KINDS:
            a, b = getattr(m.passes, kind), getattr(e.passes, kind)
            assert all(getattr(a, f) == getattr(b, f) for f in TABLE_FIELDS), (name, kind)
    assert est.colocation == h200.colocation and est.runtime == h200.runtime and est.link == h200.link


# A pass table by hand: 2 ms of weights, 1 us of ideal compute per token. Launch, read at the first knot (1 token):
# 3.0 - 2.0 - 0.001 = 0.999; compute = 3.0 - 2.0 - 0.999 = 0.001 at 1 token and 4.0 - 2.0 - 0.999 = 1.001 at 64.
TABLE = PassTable(points=[], fit="buckets", round_up=True, knots=[1, 64], knot_ms=[3.0, 4.0], ctx_ms=1e-4,
                  row_ms=2e-3, ext_ms=3e-3, linear_c0=2.5, linear_c_tok=0.02)  # fmt: skip


def test_twice_the_bandwidth_halves_the_weight_and_kv_parts_and_keeps_launch():
    t = scale_table(TABLE, 2.0, 0.001, Scale(bandwidth=0.5, kv=0.5, flops=1.0))
    assert t.knot_ms == pytest.approx([0.999 + 1.0 + 0.001, 0.999 + 1.0 + 1.001])
    assert (t.ctx_ms, t.row_ms, t.ext_ms) == pytest.approx((5e-5, 1e-3, 3e-3))
    assert t.linear_c0 == pytest.approx(0.5 + 1.0)  # intercept 2.5 = 0.5 launch + 2.0 weights
    assert t.linear_c_tok == pytest.approx(0.02)
    assert t.points == [] and t.errors == {}


def test_twice_the_flops_halves_the_compute_part_only():
    t = scale_table(TABLE, 2.0, 0.001, Scale(bandwidth=1.0, kv=1.0, flops=0.5))
    assert t.knot_ms == pytest.approx([0.999 + 2.0 + 0.0005, 0.999 + 2.0 + 0.5005])
    assert (t.ctx_ms, t.ext_ms, t.linear_c0, t.linear_c_tok) == pytest.approx((1e-4, 1.5e-3, 2.5, 0.01))


def test_unit_factors_give_the_table_back_bit_for_bit():
    t = scale_table(TABLE, 2.0, 0.001, Scale(1.0, 1.0, 1.0))
    assert all(getattr(t, f) == getattr(TABLE, f) for f in TABLE_FIELDS)


def test_a_gpu_with_twice_the_bandwidth_saves_half_the_weight_streaming(h200, monkeypatch):
    h = gpus.GPU_SPECS["h200"]
    monkeypatch.setitem(
        gpus.GPU_SPECS, "h200x2", gpus.GpuSpec("2x", 9600.0, h.bf16_tflops, 141.0, 132, "NVLink", 900.0)
    )
    est = estimate_profile(h200, "h200x2")
    # Qwen3-32B streams every weight but the (untied) embedding: 64 layers of q/k/v/o (5120 hidden, 64 x 128 q,
    # 8 x 128 kv) and a 25600-wide MLP, their norms, the final norm and the LM head; bf16.
    layer = 5120 * 8192 * 2 + 2 * 5120 * 1024 + 3 * 5120 * 25600 + 2 * 5120 + 2 * 128
    weights_ms = (64 * layer + 151936 * 5120 + 5120) * 2 / (h200.gpu.mem_bw_gbs * 1e6)
    a, e = h200.models["qwen3-32b"].passes.decode, est.models["qwen3-32b"].passes.decode
    assert e.knot_ms[0] == pytest.approx(a.knot_ms[0] - weights_ms / 2)
    assert e.ctx_ms == pytest.approx(a.ctx_ms / 2)
    assert est.models["qwen3-32b"].host == h200.models["qwen3-32b"].host
    assert est.gpu.mem_bw_gbs == pytest.approx(2 * h200.gpu.mem_bw_gbs)


def test_load_profile_by_gpu_kind_is_marked_estimated():
    p = load_profile("l4")
    assert (p.kind, p.gpu.name, p.gpu.memory_gb) == ("estimated", "NVIDIA L4", 24.0)
    assert profile_label(p) == "ESTIMATED (l4 from h200 measured 2026-12-01, bytes/FLOPs scaling)"
    assert profile_label(load_profile("h200")) == ""
    assert load_profile("h200").kind == "measured"  # a bundled profile wins over the kind of the same name
    # 300 / 4800 GB/s: a 16x slower weight stream; the 0.6B's decode at one row is at least that share slower
    # than the H200's measured one (1.19 GB of weights at the profile's 4,214.6 GB/s, 15 more times).
    d = p.models["qwen3-0.6b"].passes.decode.knot_ms[0]
    assert d > load_profile("h200").models["qwen3-0.6b"].passes.decode.knot_ms[0] + 1.19e9 / 4214.6e6 * 15
    # the simulator prices it, with KV budgets capped by what 24 GB leaves: 21.6 - 16.38 GB for the 8B
    cost = CostModel(p, "separate", models=["qwen3-0.6b", "qwen3-8b"])
    assert cost.for_model(1).step_ms(StepStats.one_pass(1, 1, graph=True)) > 50
    assert cost.kv_budget_gb(1) == pytest.approx(24 * 0.9 - p.models["qwen3-8b"].weight_bytes / 1e9)
    assert cost.kv_budget_gb(0) == pytest.approx(20.40790016)


def test_an_estimated_profile_saves_and_loads(tmp_path):
    p = load_profile("l40s")
    again = load_profile(p.save(tmp_path / "l40s.json"))
    assert again == p
    assert "estimated_from" not in json.loads(load_profile("h200-analytic").to_json())


def test_unknown_gpu_kind_is_one_line_listing_the_known_ones(h200):
    with pytest.raises(ProfileError, match=r"^unknown GPU kind 'b200'; known: h200, h100, a100, l40s, l4$"):
        estimate_profile(h200, "b200")
    with pytest.raises(ProfileError, match=r"GPU kinds \(estimated from h200\): h200, h100, a100, l40s, l4"):
        load_profile("b200")


def test_fits_weights_plus_a_minimum_kv_in_usable_memory():
    # usable memory: 90% of 24 = 21.6 GB (L4), 43.2 (L40S), 72 (H100). Weights: 0.6B 1.19 GB, 8B 16.38, 32B 65.52.
    assert fits("l4", "qwen3-8b") and not fits("l4", "qwen3-32b")
    assert not fits("l4", ["qwen3-8b", "qwen3-4b"])  # 16.38 + 8.04 + 2
    assert fits("h100", ["qwen3-0.6b", "qwen3-32b"])  # 1.19 + 65.52 + 2 = 68.7
    assert not fits("l40s", "qwen3-32b") and fits("l40s", "qwen3-32b", tp=2)  # 32.76 + 1
    assert fits(load_profile("l4"), "qwen3-8b")
    msg = fit_error("l4", "qwen3-32b")
    assert msg.startswith("qwen3-32b at tp=1 needs 66.5 GB per GPU") and "NVIDIA L4 has 21.6 GB usable" in msg
    assert "\n" not in msg and fit_error("h200", "qwen3-32b") == ""


def test_trsim_profile_writes_the_estimate(tmp_path, capsys):
    out = tmp_path / "l4.json"
    with pytest.raises(SystemExit) as e:
        trsim.main(["profile", "--gpu", "L4", "-o", str(out)])
    assert not e.value.code
    text = capsys.readouterr().out
    assert "ESTIMATED (l4 from h200 measured" in text and "qwen3-32b" in text
    assert load_profile(out).kind == "estimated"
    with pytest.raises(SystemExit) as e:
        trsim.main(["profile", "--gpu", "b200"])
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and err.strip() == "trsim: error: unknown GPU kind 'b200'; known: h200, h100, a100, l40s, l4"
    )
