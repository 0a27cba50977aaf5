"""studies/engine/perf_probe.py: the trace analysis on a synthetic GPU-like kernel trace, and a CPU smoke run
of the whole script (the GPU run gets one shot, so its plumbing is checked here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from study_script import load_study

PROBE = Path(__file__).resolve().parents[2] / "studies" / "engine" / "perf_probe.py"
VARIANT_NAMES = ("baseline", "default", "fused_reduce", "step_fusion", "pdl", "no_pdl")


@pytest.fixture(scope="module")
def probe():
    return load_study(PROBE)


PREFIX = [("direct_copy_kernel_cuda", 1.5), ("indexSelectLargeIndex", 2.0)]
LAYER = [
    ("_rms_norm_kernel", 2.0),
    ("nvjet_hsh_64x8_qkv", 12.0),
    ("_qk_norm_rope_store_kernel", 2.5),
    ("paged_attention_fwd_kernel", 5.0),
    ("split_reduce_kernel", 3.0),
    ("nvjet_hsh_64x8_o", 9.0),
    ("_rms_norm_kernel", 2.0),
    ("sm90_xmma_gemm_gate_up", 40.0),
    ("splitKreduce_kernel", 2.0),
    ("_silu_and_mul_kernel", 2.5),
    ("nvjet_hsh_down", 25.0),
]
SUFFIX = [
    ("vectorized_elementwise_kernel<CUDAFunctor_add>", 1.5),
    ("indexSelectSmallIndex", 1.5),
    ("_rms_norm_kernel", 2.0),
    ("nvjet_lm_head", 70.0),
    ("reduce_kernel<ArgMaxOps<float>>", 4.0),
    ("direct_copy_kernel_cuda", 1.0),
]


def _trace(num_layers: int, replays: int, gap: float = 1.0, with_corr: bool = True) -> list[dict]:
    seq = PREFIX + LAYER * num_layers + SUFFIX
    events, t = [], 0.0
    for r in range(replays):
        for name, dur in seq:
            events.append({"name": name, "ts": t, "dur": dur, "corr": (100 + r) if with_corr else None})
            t += dur + gap
        t += 50.0  # host sync between replays
    return events


@pytest.mark.parametrize("with_corr", [True, False])
def test_trace_analysis(probe, with_corr):
    layers, n = 4, 3
    replays = probe.split_replays(_trace(layers, n, with_corr=with_corr), n)
    assert len(replays) == n and all(len(r) == len(replays[0]) for r in replays)
    kernels = probe.representative(replays)
    res = probe.analyze(kernels, layers, gemm_bytes=[12e6, 9e6, 40e6, 25e6])
    assert "layer_error" not in res
    assert res["layer_kernels"] == len(LAYER)
    per = res["per_layer"]
    assert per["attention"] == 5.0 and per["attn_reduce"] == 3.0 and per["norm"] == 4.0
    assert per["gemm"] == 12 + 9 + 40 + 2 + 25 and per["act"] == 2.5 and per["rope_store"] == 2.5
    assert res["layer_gap_us"] == pytest.approx(len(LAYER) * 1.0)
    assert res["gemm_us"] == [12.0, 9.0, 42.0, 25.0]  # the split-K reduce joins its GEMM
    assert res["gemm_gbps"][0] == pytest.approx(1000.0)
    assert res["busy_us"] == pytest.approx(sum(d for _, d in PREFIX + LAYER * layers + SUFFIX))
    assert probe.category("reduce_kernel<ArgMaxOps<float>>") == "argmax"
    assert probe.category("indexSelectLargeIndex") == "gather"


def test_trace_analysis_unexpected_norm_count(probe):
    kernels = probe.representative(probe.split_replays(_trace(2, 1), 1))
    res = probe.analyze(kernels, 3)
    assert "layer_error" in res and res["per_layer"]["gemm"] > 0


def test_probe_smoke_run(tmp_path):
    """The whole probe on a tiny config on CPU (torch paths, graph emulation): every section runs error-free
    and the outputs are written."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(PROBE), "--out", str(tmp_path), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "perf_probe.json").read_text())
    assert not out["errors"], out["errors"]
    assert {r["variant"] for r in out["variants"]} == set(VARIANT_NAMES)
    assert all(r["corr_agree"] == 1.0 for r in out["variants"])
    assert (tmp_path / "variants.csv").is_file() and (tmp_path / "noise.csv").is_file()
    assert len(proc.stdout.split("=" * 118)[-1].strip().splitlines()) < 40
