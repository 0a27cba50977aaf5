"""studies/engine/rope_heads.py on CPU: its smoke shapes at every heads-a-program choice in Triton's interpreter, every
output identical to one head a program, in a child process (the interpreter must be chosen before Triton is
imported)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from study_script import load_study, smoke_result

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_every_heads_choice_gives_the_same_outputs_in_the_interpreter(tmp_path: Path) -> None:
    stdout, data = smoke_result("studies/engine/rope_heads.py", tmp_path)
    out = data
    study = load_study("studies/engine/rope_heads.py")
    assert [r["tokens"] for r in out["kernel"]] == list(study.SMOKE_TOKENS)
    for r in out["kernel"]:
        assert all(r[f"hp{hp}_identical"] for hp in study.HP), r
    assert out["passes"] == [] and out["errors"] == []
    assert "ROPE HEADS" in stdout
