"""tokenrouter.steplog: the step-log format the runtime and the simulator share, and the timeline summary, checked
against hand-worked timelines and a brute-force sampling of the union; the simulator's logs against its own
counters; `trsim run --step-logs` and `tr serve --step-logs` as a user runs them."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import pytest

from tokenrouter.steplog import device_interval, load_step_logs, timeline, union_s, write_step_logs


def rec(model: int, launch: float, done: float, *, rows: int = 1, tokens: int = 1, ext: int = 0,
        gpu: tuple[float, float] | None = None) -> dict:  # fmt: skip
    r = {"model": model, "step": 0, "rows": rows, "launch": launch, "done": done, "gpu_ms": 0.0, "tokens": tokens,
         "ext_rows": int(ext > 0), "ext_tokens": ext, "back_to_back": False, "submitted": launch}  # fmt: skip
    if gpu is not None:
        r["gpu_start"], r["gpu_end"] = gpu
    return r


def test_union_matches_a_sampled_count():
    rng = random.Random(3)
    for _ in range(20):
        ivs = [(a, a + rng.uniform(0, 0.3)) for a in (rng.uniform(0, 1) for _ in range(rng.randint(1, 8)))]
        lo, hi = 0.1, 0.9
        grid = [lo + (hi - lo) * (k + 0.5) / 20000 for k in range(20000)]
        sampled = sum(any(a <= t < b for a, b in ivs) for t in grid) * (hi - lo) / 20000
        assert union_s(ivs, lo, hi) == pytest.approx(sampled, abs=2e-3)


def test_timeline_of_a_hand_worked_run():
    # model 0: passes [0,1] [2,3] [5,6]; model 1: [0.5,2.5]; window 0..10 s. Covered: [0,3] and [5,6] = 4 s.
    logs = {0: [rec(0, 0, 1, rows=2, tokens=2), rec(0, 2, 3, rows=4, tokens=4), rec(0, 5, 6, rows=6, tokens=9, ext=4)],
            1: [rec(1, 0.5, 2.5, rows=1, tokens=10, ext=10)]}  # fmt: skip
    tl = timeline(logs, (0.0, 10.0))
    m0, m1 = tl.models
    assert tl.idle_share == pytest.approx(0.6)
    assert (m0.steps, m0.rows_per_step, m0.tokens_per_step) == (3, 4.0, 5.0)
    assert m0.ext_tokens_per_step == pytest.approx(4 / 3)
    assert m0.busy_share == pytest.approx(0.3) and m1.busy_share == pytest.approx(0.2)
    assert m0.gap_ms == pytest.approx(1500.0)  # gaps of 1 s and 2 s
    assert m0.step_ms == pytest.approx(1000.0) and m1.step_ms == pytest.approx(2000.0)
    # a narrower window cuts busy time and drops the passes that end outside it
    tl = timeline(logs, (0.0, 2.0))
    assert [m.steps for m in tl.models] == [1, 0]
    assert tl.idle_share == pytest.approx(0.0)  # [0,1] and [0.5,2.5] cover all of 0..2


def test_device_interval_prefers_the_measured_pass():
    assert device_interval(rec(0, 1.0, 2.0, gpu=(1.2, 1.7))) == (1.2, 1.7)
    live = {**rec(0, 1.0, 2.0), "gpu_ms": 400.0}  # the pass ended by the time the host saw it
    assert device_interval(live) == pytest.approx((1.6, 2.0))
    # a pass that began while the host still enqueued it (launch = when the enqueue returned): from `submitted`
    slow_enqueue = {**rec(0, 1.8, 2.0), "submitted": 1.0, "gpu_ms": 900.0}
    assert device_interval(slow_enqueue) == pytest.approx((1.1, 2.0))
    assert device_interval(rec(0, 1.0, 2.0)) == (1.0, 2.0)  # CPU: no device time taken


def test_write_and_load_round_trip_skips_a_cut_line(tmp_path):
    logs = {0: [rec(0, 2, 3), rec(0, 0, 1)], 1: [rec(1, 0.5, 0.7)]}
    write_step_logs(logs, tmp_path)
    with open(tmp_path / "steps1.jsonl", "a") as f:
        f.write('{"model": 1, "launch"')  # a process killed mid-line
    back = load_step_logs(tmp_path)
    assert [r["launch"] for r in back[0]] == [0, 2] and len(back[1]) == 1
    with pytest.raises(ValueError, match="no step logs"):
        load_step_logs(tmp_path / "empty")


def test_the_simulators_logs_agree_with_its_counters():
    from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig
    from tokenrouter.sim.run import SimConfig, run_sim

    dep = DeploymentConfig(
        models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")],
        router=RouterConfig(hop_rate=0.1),
        policy=PolicyConfig(kind="delayed", thresholds=[1, 4]),
    )
    res = run_sim(SimConfig(dep, num_requests=16, concurrency=4, seed=1, step_logs=True))
    logs = res.extra["step_logs"]
    for m in (0, 1):
        recs = logs[m]
        assert len(recs) == res.summary[f"steps_model{m}"]
        for a, b in itertools.pairwise(recs):
            assert b["gpu_start"] >= a["gpu_end"] - 1e-12  # one model's passes never overlap on its GPU
        assert all(r["launch"] <= r["gpu_start"] <= r["gpu_end"] <= r["done"] for r in recs)
        assert all(r["tokens"] == sum(r["row_tokens"]) and r["rows"] == len(r["row_ctx"]) for r in recs)
    # every output token was sampled by some row of some step: rows >= output tokens written
    assert sum(r["rows"] for m in (0, 1) for r in logs[m]) >= res.summary["total_output_tokens"]
    assert "step_logs" not in run_sim(SimConfig(dep, num_requests=4, concurrency=2)).extra


def trsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli.trsim", *args], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_trsim_run_writes_the_live_format_and_refuses_old_logs(tmp_path):
    out = tmp_path / "logs"
    args = ("run", "--hop-rate", "0.1", "-n", "4", "--num-requests", "8", "--thresholds", "1,3")
    r = trsim(*args, "--step-logs", str(out))
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (out / "steps1.jsonl").read_text().splitlines()]
    live_keys = {"model", "step", "rows", "launch", "done", "gpu_ms", "back_to_back", "submitted", "tokens",
                 "ext_rows", "ext_tokens", "ctx", "row_tokens", "row_ctx", "graph", "varlen"}  # fmt: skip
    assert recs and all(set(x) == live_keys | {"gpu_start", "gpu_end"} for x in recs)
    r = trsim(*args, "--step-logs", str(out))
    assert r.returncode == 2 and "already holds step logs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "f").write_text("")
    r = trsim(*args, "--step-logs", str(tmp_path / "f"))
    assert r.returncode == 2 and "is a file" in r.stderr
