"""studies/two_gpus/tp_bench.py on CPU (gloo, two processes, tiny-large): the JSON the two-GPU study reads has its
keys, and tp=2's greedy tokens are tp=1's. Measures nothing about GPUs; it keeps the script runnable before its one
GPU run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "studies" / "two_gpus" / "tp_bench.py"
KEYS = ("tp1_b1_step_ms", "tp2_b1_step_ms", "tp2_over_tp1_b1", "tp2_greedy_equal", "prompts", "tokens", "gpu",
        "torch", "date", "command")  # fmt: skip


def test_cpu_smoke_writes_the_keys_and_tp2_greedy_equals_tp1(tmp_path):
    out = tmp_path / "tp_bench.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny-large", "--context", "64", "--steps", "5",
           "--warmup", "1", "--num-prompts", "3", "--tokens", "64", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""  # with --out, stdout carries nothing (the summary is on stderr)
    assert "SUMMARY tp_bench" in proc.stderr
    r = json.loads(out.read_text())
    assert all(k in r for k in KEYS), [k for k in KEYS if k not in r]
    assert r["tp2_greedy_equal"] is True and r["tp2_greedy_first_diff"] is None
    one, two = r["tp1"]["greedy"], r["tp2"]["greedy"]
    assert len(one) == len(r["prompts"]) == 3 and all(len(t) == r["tokens"] == 64 for t in one)
    assert two == one
    assert len({t for toks in one for t in toks}) > 10  # not one token repeated: a check that could fail
    assert r["tp1_b1_step_ms"] > 0 and r["tp2_b1_step_ms"] > 0
    assert abs(r["tp2_over_tp1_b1"] - r["tp2_b1_step_ms"] / r["tp1_b1_step_ms"]) < 1e-2 * r["tp2_over_tp1_b1"]
    assert r["gpu"] == "cpu" and r["tokens"] == 64
