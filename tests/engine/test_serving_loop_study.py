"""studies/engine/serving_loop.py --smoke: the whole study on a tiny model on CPU (graph emulation), so the one
GPU run is not its first run; checks the summary holds every key the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path

from study_script import load_study

STUDY = Path(__file__).resolve().parents[2] / "studies" / "engine" / "serving_loop.py"


def test_smoke_writes_the_summary(tmp_path, capsys):
    mod = load_study(STUDY)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in ("host_overhead_frac_overlap", "graph_fraction_mixed", "prepare_ms_b256_ctx8k", "startup_s",
                "jit_compiles_after_warmup", "memory", "decode_b1_ms", "idle_gap_ms"):  # fmt: skip
        assert key in s, key
    assert s["errors"] == [] and s["graph_fraction_mixed"] == 1.0 and s["jit_compiles_after_warmup"] == 0
    assert s["memory"]["qwen3-0.6b"]["num_pages"] == 400
    assert (tmp_path / "steps.csv").is_file()
    printed = capsys.readouterr().out
    assert "SUMMARY serving_loop" in printed and len(printed.split("SUMMARY")[-1]) < 4000
