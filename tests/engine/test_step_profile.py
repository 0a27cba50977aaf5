"""studies/engine/step_profile.py: kernel classes of a synthetic trace, the decode-tile switch it uses for its
A/B runs, and a CPU smoke run of the profile and greedy modes (the GPU run gets one shot)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "studies" / "engine" / "step_profile.py"


@pytest.fixture(scope="module")
def sp():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_classify_one_layer_step(sp):
    names = ["_prologue_kernel", "_rms_norm_kernel", "skinny_gemm_kernel", "_qk_norm_rope_store_kernel",
             "paged_attention_fwd_kernel", "skinny_gemm_kernel", "_rms_norm_kernel", "skinny_gemm_kernel",
             "skinny_gemm_kernel", "_rms_norm_kernel", "nvjet_tst_lm_head", "reduce_kernel<ArgMaxOps>",
             "_sample_kernel", "Memcpy DtoH"]  # fmt: skip
    kernels = [{"name": n, "dur": 1.0 + i, "off": 10.0 * i} for i, n in enumerate(names)]
    res = sp.classify(kernels, num_layers=1)
    got = {c: v["count"] for c, v in res["classes"].items() if v["count"]}
    assert got == {"gemm": 4, "lm_head": 1, "attention": 1, "norm": 3, "rope_store": 1, "sample": 1, "prologue": 1,
                   "argmax": 1, "copy": 1}  # fmt: skip
    assert res["kernels"] == len(names) and res["kernels_per_layer"] == 9
    assert res["busy_us"] == sum(k["dur"] for k in kernels) and res["span_us"] == 130.0 + 14.0


def test_set_decode_config_round_trip(sp):
    from tokenrouter.engine.attention import triton_common as tc
    from tokenrouter.engine.attention import triton_decode as td

    prev = sp.set_decode_config(64, 4, 2)
    try:
        assert prev is None  # the engine picks by split length
        assert td.decode_attention_triton.__kwdefaults__["config"] == tc.KernelConfig(block_n=64, num_warps=4,
                                                                                       num_stages=2)  # fmt: skip
    finally:
        sp.restore_decode_config(prev)
    assert td.decode_attention_triton.__kwdefaults__["config"] is None


def test_decode_config_by_split_length():
    from tokenrouter.engine.attention.triton_common import DECODE_CONFIG, SHORT_DECODE_CONFIG, decode_config

    assert decode_config(33, 8256) is SHORT_DECODE_CONFIG  # b=1 at an 8k table: <= 4 tiles a split
    assert decode_config(9, 8256) is DECODE_CONFIG  # b=8: 15 tiles a split keep the pipelined tile
    assert decode_config(66, 40960) is DECODE_CONFIG


def test_smoke_runs(sp, tmp_path):
    assert sp.main(["profile", "--out", str(tmp_path / "p"), "--smoke"]) == 0
    out = json.loads((tmp_path / "p" / "step_profile.json").read_text())
    assert not out["errors"] and [c["case"] for c in out["cases"]] == ["tiny_b1", "tiny_b4"]
    assert sp.main(["greedy", "--out", str(tmp_path / "g"), "--models", "tiny-small", "--steps", "2"]) == 0
    rows = json.loads((tmp_path / "g" / "greedy.json").read_text())["rows"]
    assert len(rows) == 4 and all(r["rows_identical"] == r["batch"] for r in rows)
