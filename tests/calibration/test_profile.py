"""Profile schema, validation errors, the analytic generator and the bundled H200 file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from tokenrouter.calibration import Profile, ProfileError, load_profile
from tokenrouter.calibration.analytic import (
    MEASURED_STREAM_GBS,
    Assumptions,
    default_bundled_path,
    generate,
    main,
    model_profile,
    stream_efficiency,
)
from tokenrouter.calibration.profile import bundled_profile_names
from tokenrouter.models.spec import bundled_model_names, load_spec


@pytest.fixture(scope="module")
def bundled() -> Profile:
    return load_profile("h200-analytic")


@pytest.fixture(scope="module")
def raw(bundled: Profile) -> dict:
    return json.loads(bundled.to_json())


def test_bundled_is_analytic_with_every_model(bundled: Profile) -> None:
    assert bundled.kind == "analytic" and bundled.schema_version == 2
    assert set(bundled.models) == set(bundled_model_names())
    assert "h200-analytic" in bundled_profile_names()
    # The default ("h200") is the measured profile once one is bundled; the analytic one stays by its name.
    assert load_profile().kind == "measured" and load_profile("h200") == load_profile("h200-measured")


def test_bundled_measured_profile_covers_the_studies() -> None:
    prof = load_profile("h200-measured")
    assert prof.kind == "measured" and prof.gpu.name == "NVIDIA H200" and prof.versions["torch"].startswith("2.11")
    assert {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-32b"} <= set(prof.models)
    pairs = {(g.model_a, g.model_b) for g in prof.colocation}
    assert {("qwen3-0.6b", "qwen3-32b"), ("qwen3-0.6b", "qwen3-8b")} <= pairs
    for name, m in prof.models.items():
        assert m.passes is not None and m.passes.decode.errors, name  # every table says how well it fits


def test_bundled_file_equals_fresh_generation() -> None:
    # The generator and the committed file cannot drift: regenerate with
    # `python -m tokenrouter.calibration.analytic` when this fails.
    assert generate().to_json() == default_bundled_path().read_bytes()


def test_round_trip(tmp_path: Path, bundled: Profile) -> None:
    p = bundled.save(tmp_path / "sub" / "p.json")
    again = Profile.load(p)
    assert again == bundled
    assert again.to_json() == p.read_bytes()
    assert load_profile(p) == bundled and load_profile(str(p)) == bundled


def _mutate(raw: dict, path: str, value: object) -> dict:
    d = json.loads(json.dumps(raw))
    *parents, last = path.split(".")
    node = d
    for k in parents:
        node = node[k]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return d


_DELETE = object()
_G = "models.qwen3-8b.step.graph"

MALFORMED: dict[str, object] = {
    "missing_version": ("schema_version", _DELETE),
    "future_version": ("schema_version", 3),
    "old_version": ("schema_version", 1),
    "string_version": ("schema_version", "1"),
    "missing_gpu": ("gpu", _DELETE),
    "missing_c0": (f"{_G}.c0", _DELETE),
    "wrong_type_tp": ("models.qwen3-8b.tp", "two"),
    "tp_zero": ("models.qwen3-8b.tp", 0),
    "negative_c_ctx": (f"{_G}.c_ctx", -1e-6),
    "negative_ipc": ("ipc_ms", -0.1),
    "bad_kind": ("kind", "guessed"),
    "unknown_field": (f"{_G}.c_typo", 1.0),
    "empty_models": ("models", {}),
    "bad_created": ("created", "yesterday"),
    "slowdown_below_one": ("mps.default_slowdown", 0.9),
    "bad_pair_key": ("mps.pairs", {"qwen3-0.6b": 1.3}),
    "pair_unknown_model": ("mps.pairs", {"qwen3-0.6b|qwen3-999b": 1.3}),
    "zero_link_bw": ("link.bandwidth_gbps", 0),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_profiles_raise_one_line_error(tmp_path: Path, raw: dict, case: str) -> None:
    path, value = MALFORMED[case]  # type: ignore[misc]
    f = tmp_path / f"bad-{case}.json"
    f.write_text(json.dumps(_mutate(raw, path, value)))
    with pytest.raises(ProfileError) as ei:
        Profile.load(f)
    msg = str(ei.value)
    assert f.name in msg and "\n" not in msg
    assert isinstance(ei.value, ValueError)
    if "models.qwen3-8b" in path and case != "empty_models":
        assert "qwen3-8b" in msg  # the offending model is named, not `[...]`
    if case == "old_version":
        assert "older" in msg and "tr calibrate" in msg  # says how to make it again


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "null"])
def test_not_a_profile_object(tmp_path: Path, text: str) -> None:
    f = tmp_path / "garbage.json"
    f.write_text(text)
    with pytest.raises(ProfileError, match=r"garbage\.json") as ei:
        load_profile(f)
    assert "\n" not in str(ei.value)


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nope\.json: profile file not found"):
        load_profile(tmp_path / "nope.json")
    with pytest.raises(ProfileError, match=r"unknown profile; bundled: .*h200-analytic"):
        load_profile("b200")  # a100 is a GPU kind: an estimated profile


def test_model_lookup(bundled: Profile) -> None:
    assert bundled.model("Qwen/Qwen3-8B") is bundled.models["qwen3-8b"]
    with pytest.raises(ProfileError, match=r"no model 'llama-70b'; known: .*qwen3-0\.6b, .*qwen3-32b"):
        bundled.model("llama-70b")
    assert bundled.router_ms_for("qwen3-8b") == bundled.router_ms
    assert bundled.kv_budget_gb_for("qwen3-8b") == bundled.kv_budget_gb


def test_per_model_overrides_and_pairs(bundled: Profile) -> None:
    m = msgspec.structs.replace(bundled.models["qwen3-0.6b"], router_ms=0.5, kv_budget_gb=3.0)
    mps = msgspec.structs.replace(bundled.mps, pairs={"qwen3-0.6b|qwen3-32b": 1.4})
    p = msgspec.structs.replace(bundled, models={**bundled.models, "qwen3-0.6b": m}, mps=mps)
    p = Profile.from_json(p.to_json())  # still valid
    assert p.router_ms_for("qwen3-0.6b") == 0.5 and p.kv_budget_gb_for("qwen3-0.6b") == 3.0
    assert p.mps_slowdown("qwen3-0.6b", "qwen3-32b") == 1.4
    assert p.mps_slowdown("qwen3-32b", "qwen3-0.6b") == p.mps.default_slowdown


# -- analytic numbers, checkable by hand -------------------------------------------------------------------


def test_stream_efficiency_hits_measurements_and_interpolates() -> None:
    for name, gbs in MEASURED_STREAM_GBS.items():
        assert stream_efficiency(load_spec(name).num_params) == pytest.approx(gbs / 4255)
    effs = [stream_efficiency(load_spec(n).num_params) for n in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b")]
    assert effs == sorted(effs) and len(set(effs)) == 4
    assert stream_efficiency(10**8) == pytest.approx(1722 / 4255)  # clamped below the smallest measurement
    assert stream_efficiency(10**12) == pytest.approx(4185 / 4255)


def _kernels_ms(layers: int, a: Assumptions) -> float:
    return (layers * a.small_kernels_per_layer + a.kernels_fixed) * a.kernel_us / 1e3


def test_qwen3_8b_decode_by_hand(bundled: Profile) -> None:
    spec, a = load_spec("qwen3-8b"), Assumptions()
    g = bundled.model("qwen3-8b").step.graph
    weights_ms = spec.decode_weight_bytes / 3947e9 * 1e3  # measured 8B streaming rate: ~3.83 ms
    launch_ms = _kernels_ms(36, a) + a.graph_launch_ms  # (36*6 + 15) kernels x 2.1 us + one replay: ~0.5 ms
    assert g.c0 == pytest.approx(weights_ms + launch_ms, rel=0.01)
    assert g.c_ctx == pytest.approx(spec.kv_bytes_per_token / (4255e9 * a.kv_read_eff) * 1e3, rel=1e-4)
    body = spec.flops_per_token - 2 * spec.vocab_size * spec.hidden_size
    elementwise = 36 * a.small_kernels_per_layer * spec.hidden_size * a.elementwise_bytes
    assert g.c_tok == pytest.approx((body / 790e12 + elementwise / 4255e9) * 1e3, rel=1e-4)
    e = bundled.model("qwen3-8b").step.eager
    assert e.floor_ms == pytest.approx((36 * (a.small_kernels_per_layer + 4) + 15) * 9.9e-3, rel=1e-4)
    assert e.c0 == pytest.approx(g.c0 - a.graph_launch_ms + a.eager_fixed_ms, rel=1e-4)


def test_eager_is_host_bound_for_small_models(bundled: Profile) -> None:
    for name in ("qwen3-0.6b",):
        s = bundled.model(name).step
        assert s.eager.at(1, 1, 0, 1024) == s.eager.floor_ms > 2 * s.graph.at(1, 1, 0, 1024)
    big = bundled.model("qwen3-32b").step
    # At batch 32 and 8k context the 32B step is GPU-bound again: eager costs about what graphs do.
    assert big.eager.at(32, 32, 0, 32 * 8192) == pytest.approx(big.graph.at(32, 32, 0, 32 * 8192), rel=0.01)


def test_unfused_engine_what_if_is_costlier() -> None:
    fused = generate(["qwen3-0.6b"]).model("qwen3-0.6b")
    unfused = generate(["qwen3-0.6b"], assumptions=Assumptions(small_kernels_per_layer=57)).model("qwen3-0.6b")
    assert fused.step.graph.c0 == pytest.approx(1192099840 / 1722e9 * 1e3 + (28 * 6 + 15) * 2.1e-3 + 0.015, rel=1e-3)
    assert unfused.step.graph.c0 > fused.step.graph.c0 + _kernels_ms(20, Assumptions())


def test_std_serving_reproduces_paper_ratios(bundled: Profile) -> None:
    a, s = Assumptions(), bundled.std_serving
    # The reference is a fused-kernel small-model step (SGLang's), not our engine's own kernel overheads.
    fused = replace(a, small_kernels_per_layer=a.std_ref_small_kernels_per_layer)
    g = model_profile(load_spec("qwen3-0.6b"), assumptions=fused).step.graph

    def step(ctx: int) -> tuple[float, float]:
        infer = g.at(8, 8, 0, 8 * ctx)
        return infer, infer + 8 * (s.hop_overhead_ms + s.hop_overhead_ms_per_ktok * ctx / 1000)

    i1, s1 = step(a.std_ref_ctx)
    _, s4 = step(a.std_long_ctx)
    assert i1 / s1 == pytest.approx(0.042, rel=1e-3)
    assert 1 - s1 / s4 == pytest.approx(0.58, rel=1e-3)


def test_tp_splits_bytes_and_adds_allreduce() -> None:
    a, spec = Assumptions(), load_spec("qwen3-32b")
    p = generate(["qwen3-32b"], tp={"qwen3-32b": 2})
    one = generate(["qwen3-32b"]).model("qwen3-32b").step.graph
    two = p.model("qwen3-32b").step.graph
    assert p.model("qwen3-32b").tp == 2
    weights_ms = spec.decode_weight_bytes / (4185e9 * 2) * 1e3
    assert two.c0 == pytest.approx(weights_ms + _kernels_ms(64, a) + 2 * 64 * a.allreduce_ms + 0.015, rel=1e-4)
    assert two.c_tok == pytest.approx(one.c_tok / 2, rel=1e-4)


def test_cli_writes_profile_and_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a100.json"
    assert main(["--out", str(out), "--models", "qwen3-0.6b", "--gpu-name", "A100", "--mem-bw-gbs", "1800"]) == 0
    p = Profile.load(out)
    assert p.gpu.name == "A100" and list(p.models) == ["qwen3-0.6b"] and p.kind == "analytic"
    assert main(["--out", str(out), "--mem-bw-gbs", "0"]) == 2
    assert main(["--out", str(out), "--models", "nope"]) == 2
    assert main(["--out", str(out), "--models", "qwen3-0.6b", "--small-kernels-per-layer", "6"]) == 0
    assert Profile.load(out).notes["assumptions"]["small_kernels_per_layer"] == 6
    assert "error:" in capsys.readouterr().err
