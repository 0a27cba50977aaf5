"""studies/engine/wide_gemm.py on CPU: its smoke shapes (a plain projection and one with SwiGLU folded) under the
engine's tile and every grid tile in Triton's interpreter, each output against torch, in a child process (the
interpreter must be chosen before Triton is imported); and its split-K and fit rules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from study_script import load_study, smoke_result

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_every_tile_matches_torch_in_the_interpreter(tmp_path: Path) -> None:
    stdout, data = smoke_result("studies/engine/wide_gemm.py", tmp_path)
    rows = data["rows"]
    study = load_study("studies/engine/wide_gemm.py")
    ops = [op for op, *_ in study.SMOKE_SHAPES["tiny"]]
    for op in ops:
        for m in study.SMOKE_ROWS:
            got = [r for r in rows if r["op"] == op and r["m"] == m]
            names = [r["variant"] for r in got]
            assert names[:2] == ["cublas", "engine"] and len(names) > 3, names
            tiles = [r for r in got if r["variant"] != "cublas"]
            assert all("error" not in r for r in tiles) and max(r["err"] for r in tiles) < 1e-4
            # the TMA kernel's tiles: only where no SwiGLU is folded into x
            tma = [r for r in tiles if r["variant"].startswith("tma_")]
            assert (len(tma) == 0) == (op == "down_silu"), names
    assert "WIDE GEMM" in stdout


def test_split_k_fills_the_programs_asked_for_with_whole_k_tiles() -> None:
    study = load_study("studies/engine/wide_gemm.py")
    # 80 weight tiles of a K = 5120 weight, 64-wide K tiles: 132 programs need split 2, 528 need 8
    assert study.split_for(80, 5120, 64, 132) == 2
    assert study.split_for(80, 5120, 64, 528) == 8
    assert study.split_for(200, 5120, 64, 132) == 1
    # K = 256 in 64-wide tiles: a split must keep >= 2 tiles, so at most 2 splits however many programs are asked
    assert study.split_for(1, 256, 64, 1000) == 2
    for s in (study.split_for(n, k, bk, p) for n in (1, 5, 80) for k in (1024, 3072) for bk in (64, 128)
              for p in (132, 528)):  # fmt: skip
        assert s & (s - 1) == 0


def test_tiles_that_overflow_shared_memory_or_registers_are_left_out() -> None:
    study = load_study("studies/engine/wide_gemm.py")
    assert study.fits(64, 64, 64, 4, 4)
    assert not study.fits(256, 128, 128, 3, 8)  # 3 x (128 + 256) x 128 x 2 B = 288 KB
    assert not study.fits(256, 128, 64, 2, 4)  # 128 x 256 fp32 accumulators over 128 threads
