"""`tokenrouter serve` running the baselines, as a user runs them: `--policy std-serving` (a config's std-serving)
serves the standard-serving baseline over HTTP, `tokenrouter bench` loads it, /metrics carries the prefix-cache
counters; `--baseline llm-only` resolves to the large model alone; refusals are one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from served import Served, free_port, terminate, write_config

pytestmark = pytest.mark.runtime


def tr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli.tr", *args], capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def test_policy_std_serving_serves_the_baseline_that_bench_loads(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml", "r2r", hop_rate=0.3)
    srv = Served.start(tmp_path, cfg, extra=("--policy", "std-serving"))
    try:
        r = tr("bench", "--url", srv.url, "--workload", "fixed:40,12", "--num-requests", "8", "-n", "4",
               "--json", str(tmp_path / "b.json"))  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads((tmp_path / "b.json").read_text())
        assert out["requests_completed"] == 8 and out["total_output_tokens"] == 8 * 12
        assert out["hops_mean"] > 0
        # Every hop is a new request at its model: the large model's requests are the hops (Stats follow a change
        # within 50 ms: poll).
        key = 'tokenrouter_prefix_requests_total{model="tiny-large"}'
        deadline = time.monotonic() + 10
        while (m := srv.metrics())[key] != out["hops_mean"] * 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert m[key] == out["hops_mean"] * 8
        assert m['tokenrouter_prefix_requests_total{model="tiny-small"}'] >= 8
        assert m['tokenrouter_prefix_hits_total{model="tiny-small"}'] > 0  # returns re-match the first visit's pages
    finally:
        assert terminate(srv) < 60
    assert srv.proc.returncode == 0 and "died" not in srv.log.read_text()


def test_baseline_dry_runs_and_refusals(tmp_path):
    """Each refusal is the one it names, whatever else listens on the machine: `tr serve` checks its HTTP port
    before it builds the baseline's server (the learned-router refusal), so the calls take a free port, never the
    default 8000."""
    cfg = write_config(tmp_path / "serve.yaml", "r2r")
    serve = ("serve", "--config", str(cfg), "--device", "cpu", "--port", str(free_port()))
    r = tr(*serve, "--baseline", "llm-only", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "tiny-large" in r.stdout and "tiny-small" not in r.stdout
    r = tr(*serve, "--baseline", "fastest")
    assert r.returncode == 2 and "--baseline must be one of std-serving, llm-only, slm-only" in r.stderr
    r = tr(*serve, "--baseline", "std-serving", "--restart-on-failure")
    assert r.returncode == 2 and "restart" in r.stderr
    r = tr(*serve, "--baseline", "std-serving", "--router-model", "random")
    assert r.returncode == 2 and "learned router" in r.stderr and "Traceback" not in r.stderr
