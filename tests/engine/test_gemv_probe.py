"""studies/engine/gemv_probe.py: the printed summary on GPU-shaped records (the GPU run gets one shot, and the
summary is what comes back), and the sweep's candidate tiles. The script's CPU smoke run (`--smoke`, Triton
interpreter, about a minute) is not part of the suite."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from study_script import load_study

PROBE = Path(__file__).resolve().parents[2] / "studies" / "engine" / "gemv_probe.py"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture(scope="module")
def gp():
    return load_study(PROBE)


def _records(gp) -> dict:
    kernels, sweep, engine = [], [], []
    for model in gp.MODELS:
        for op in gp.OPS:
            for m in gp.ROWS:
                us = 10.0 + m
                kernels.append({"model": model, "op": op, "m": m, "n": 4096, "k": 4096, "config": "fma4x1024",
                                "cublas_us": us + 2, "ours_us": us, "cublas_us_2": us + 2.1, "ours_us_2": us + 0.1,
                                "ours_pdl_us": us - 1, "ours_gbps": 3300.0, "cublas_gbps": 2900.0, "err": 2e-3,
                                "err_pdl": 2e-3, "cublas_err": 2e-3, "bytes": 33554432, "copies": 8})  # fmt: skip
                sweep.append({"model": model, "op": op, "m": m, "config": "dot64x128s4/k4", "us": us * 0.9,
                              "err": 1e-3})  # fmt: skip
        for variant in ("off", "on", "on_nopf"):
            rec = {"model": model, "variant": variant, "gemv": variant != "off", "pdl": True, "graphs": True,
                   "graph_error": None, "pdl_error": None, "launches_per_layer": 9 if variant == "off" else 8,
                   "skinny_per_layer": 0 if variant == "off" else 4}  # fmt: skip
            for b in (1, 4, 8) if variant != "on_nopf" else (1,):
                rec.update({f"step_ms_b{b}": 4.8, f"replay_ms_b{b}": 4.79, f"pct_copy_b{b}": 74.0})
            if variant != "on_nopf" and model != "qwen3-32b":
                rec.update(corr_max_rel=2.2e-2, corr_median_rel=1e-2, corr_agree=0.98, corr_rows=47, counters_zero=True)
            engine.append(rec)
    engine.append({"model": "qwen3-32b x4", "variant": "on", "gemv": True, "graphs": True, "launches_per_layer": 8,
                   "skinny_per_layer": 4, "corr_max_rel": 1.5e-2, "corr_agree": 0.96, "off_corr_max_rel": 1.5e-2,
                   "off_corr_agree": 0.96})  # fmt: skip
    env = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "python": "3.12"}
    return {"env": env, "errors": ["engine qwen3-32b: RuntimeError: boom"], "kernels": kernels, "engine": engine,
            "sweep": sweep, "skipped": ["sweep qwen3-32b down"], "copy_gbps": 4240.0}  # fmt: skip


def test_summary_fits_and_reports_everything(gp):
    lines = gp.GemvProbe.summary(SimpleNamespace(out=_records(gp), elapsed=lambda: 200.0))
    text = "\n".join(lines)
    assert len(lines) < 30, text
    assert all(len(line) <= 170 for line in lines), text
    assert "M16 28.0/26.0" in text and "[a'] sweep: 75 cases" in text
    assert "qwen3-32b x4" in text and "(off: 1.5e-02 96%)" in text and "8(4)" in text and "9(0)" in text
    assert "boom" in text and "skipped 1" in text and "nopf b1 4.800" in text


def test_sweep_candidates(gp):
    from tokenrouter.engine import triton_gemv as G

    for m in (1, 2, 4, 8, 16):
        cands = gp.sweep_configs(G, m, 4096, 12288, 132)
        assert any(c.dot for c in cands.values())
        assert any(not c.dot for c in cands.values()) == (m <= 4)
        for c in cands.values():
            assert 12288 % (c.split_k * c.block_k) == 0
    assert gp.cfg_name(G.gemv_config(8, 4096, 12288)) == "dot64x128s4/k4"
