"""studies/engine/extend_tiles.py on CPU: its smoke cases (varlen short rows behind padding rows, a prefill in the
long group) under every tile config in Triton's interpreter, each output against the torch reference, in a child
process (the interpreter must be chosen before Triton is imported)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from study_script import load_study, smoke_result

SCRIPT = Path(__file__).resolve().parents[2] / "studies" / "engine" / "extend_tiles.py"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_every_tile_config_matches_the_reference_in_the_interpreter(tmp_path: Path) -> None:
    stdout, data = smoke_result("studies/engine/extend_tiles.py", tmp_path)
    rows = data
    study = load_study("studies/engine/extend_tiles.py")
    assert {r["case"] for r in rows} == {c[0] for c in study.SMOKE_CASES}
    for case, *_ in study.SMOKE_CASES:
        got = [r for r in rows if r["case"] == case]
        assert [r["variant"] for r in got] == [v[0] for v in study.VARIANTS]
        assert all("error" not in r for r in got) and max(r["err"] for r in got) < 1e-4
    assert "EXTEND TILES" in stdout


def test_without_a_gpu_the_script_asks_for_the_interpreter(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run the GPU study")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "TRITON_INTERPRET=1" in proc.stderr


def test_forced_and_dynamic_split_variants_match_the_reference(tmp_path: Path) -> None:
    """`--splits` and `--dyn` add variants (forced split counts; dynamic splits with and without a grid cap, in
    128-row tiles, capped at 4 programs) that must match the reference too, the group-8 case's dynamic ones merged
    in the kernel."""
    stdout, rows = smoke_result("studies/engine/extend_tiles.py", tmp_path,
                                ("--splits", "3", "--dyn", "16,16:2,16@m128_w8,16/4"))  # fmt: skip
    study = load_study("studies/engine/extend_tiles.py")
    for case, *_ in study.SMOKE_CASES:
        got = [r for r in rows if r["case"] == case]
        assert [r["variant"] for r in got] == ["base", "s3", "d16", "d16x2", "d16@m128_w8", "d16p4"]
        assert all("error" not in r for r in got) and max(r["err"] for r in got) < 1e-4
    assert "d16x2" in stdout
