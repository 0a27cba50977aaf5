from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tokenrouter.metrics import MetricsCollector
from tokenrouter.plots import plot_run, plot_sweep

approx = pytest.approx


def _trace() -> MetricsCollector:
    """Four requests; values in the tests below are worked out by hand from these calls."""
    c = MetricsCollector(num_models=2)
    c.on_arrival("A", 0.0, 10)
    c.on_arrival("B", 0.2, 20)
    c.on_tokens("A", 1, 0.5, 0)
    c.on_tokens("B", 3, 0.6, 0)  # a 3-token first chunk: one TTFT, no ITL entries
    c.on_tokens("A", 1, 0.7, 0)
    c.on_tokens("A", 2, 1.0, 1)  # hop to model 1, 2 tokens at once
    c.on_arrival("C", 1.0, 5)
    c.on_tokens("A", 1, 1.1, 0)  # hop back
    c.on_finish("A", 1.1)
    c.on_arrival("D", 1.2, 5)
    c.on_tokens("C", 1, 1.3, 0)
    c.on_finish("C", 1.3)
    c.on_tokens("B", 1, 1.4, 0)
    c.on_tokens("B", 1, 1.4, 0)  # same instant: same chunk as the previous call
    c.on_finish("B", 1.4)
    c.on_tokens("D", 1, 1.5, 0)  # D never finishes
    c.on_batch(0, 0.4, 0.5, 2)
    c.on_batch(0, 0.6, 0.7, 2)
    c.on_batch(0, 0.65, 0.8, 1)  # overlaps the previous step: busy time counts once
    c.on_batch(1, 0.8, 1.0, 1)
    c.on_queue(0, 0.0, 2)
    c.on_queue(0, 0.5, 0)
    c.on_queue(0, 1.0, 1)
    return c


def test_record_fields() -> None:
    c = _trace()
    a = c.records["A"]
    assert a.token_times == [0.5, 0.7, 1.0, 1.0, 1.1]
    assert a.output_len == 5 and a.num_hops == 2 and a.model_tokens == {0: 3, 1: 2}
    assert a.ttft == approx(0.5) and a.e2e == approx(1.1)
    assert c.itl() * 1e3 == approx([200, 150, 150, 100, 400, 400])


def test_summary_hand_computed() -> None:
    s = _trace().summary()
    # Completed: A (5 tokens), B (5), C (1). Duration: first arrival 0.0 to last finish 1.4.
    assert s["requests_completed"] == 3 and s["requests_unfinished"] == 1
    assert s["duration_s"] == approx(1.4)
    assert s["total_input_tokens"] == 35 and s["total_output_tokens"] == 11
    assert s["output_throughput_tok_s"] == approx(11 / 1.4)
    assert s["request_throughput_req_s"] == approx(3 / 1.4)
    # TTFT 500, 400, 300 ms; p99 interpolates between 400 and 500.
    assert (s["ttft_ms_mean"], s["ttft_ms_p50"], s["ttft_ms_p99"]) == approx((400, 400, 498))
    # TPOT: A (1.1 - 0.5) / 4 = 150 ms, B (1.4 - 0.6) / 4 = 200 ms; C has one token, no TPOT.
    assert (s["tpot_ms_mean"], s["tpot_ms_p50"], s["tpot_ms_p99"]) == approx((175, 175, 199.5))
    # ITL: A 200, 300/2, 300/2, 100; B 800/2, 800/2 ms.
    assert (s["itl_ms_mean"], s["itl_ms_p50"], s["itl_ms_p99"]) == approx((1400 / 6, 175, 400))
    assert (s["e2e_ms_mean"], s["e2e_ms_p50"], s["e2e_ms_p99"]) == approx((2600 / 3, 1100, 1198))
    assert s["hops_mean"] == approx(2 / 3)
    assert (s["tokens_model0"], s["tokens_model1"]) == (9, 2)
    assert s["token_frac_model1"] == approx(2 / 11)
    assert s["busy_frac_model0"] == approx(0.3 / 1.4) and s["busy_frac_model1"] == approx(0.2 / 1.4)
    assert (s["steps_model0"], s["batch_mean_model0"], s["batch_p50_model0"]) == approx((3, 5 / 3, 2))
    assert (s["batch_p99_model0"], s["batch_max_model0"]) == (2, 2)
    # Queue 2 for 0.5 s, 0 for 0.5 s, 1 for 0.4 s over 1.4 s.
    assert s["queue_mean_model0"] == approx(1.0) and math.isnan(s["queue_mean_model1"])
    assert "steady_output_throughput_tok_s" not in s


def test_summary_window() -> None:
    s = _trace().summary(window=(0.5, 1.1))
    # Half-open (0.5, 1.1]: a step's tokens count at its end. A's tokens at 0.7, 1.0 (x2), 1.1 and B's 3 at
    # 0.6; A's token at 0.5 is out; A finishes at 1.1, inside.
    assert s["steady_output_throughput_tok_s"] == approx(7 / 0.6)
    assert s["steady_request_throughput_req_s"] == approx(1 / 0.6)
    assert s["steady_busy_frac_model0"] == approx(0.2 / 0.6)
    assert s["steady_busy_frac_model1"] == approx(0.2 / 0.6)
    with pytest.raises(ValueError, match="t1 > t0"):
        _trace().summary(window=(1.0, 1.0))


def test_batch_and_queue_series() -> None:
    c = _trace()
    assert sorted(c.batch_series(0)[2].tolist()) == [1, 2, 2]
    t, n = c.queue_series(0)
    assert t.tolist() == [0.0, 0.5, 1.0] and n.tolist() == [2, 0, 1]
    assert c.batch_series(1)[2].tolist() == [1]


def test_percentiles_and_empty_samples() -> None:
    c = MetricsCollector()
    for k in range(100):
        c.on_arrival(f"r{k}", 0.0, 1)
        c.on_tokens(f"r{k}", 1, (k + 1) / 1000, 0)  # TTFT 1..100 ms, one token each
        c.on_finish(f"r{k}", 1.0)
    s = c.summary()
    assert (s["ttft_ms_mean"], s["ttft_ms_p50"], s["ttft_ms_p99"]) == approx((50.5, 50.5, 99.01))
    # One-token requests have no TPOT or ITL: NaN, not a misleading 0.
    assert math.isnan(s["tpot_ms_mean"]) and math.isnan(s["itl_ms_p99"])
    assert math.isnan(s["batch_mean_model0"]) and s["busy_frac_model0"] == 0.0

    empty = MetricsCollector().summary()
    assert empty["requests_completed"] == 0 and math.isnan(empty["output_throughput_tok_s"])


def test_hops_override_and_errors() -> None:
    c = MetricsCollector()
    c.on_arrival("x", 0.0, 1)
    c.on_tokens("x", 0, 0.1, 1)  # no tokens: ignored, not a hop
    c.on_tokens("x", 2, 0.2, 0)
    c.on_finish("x", 0.2, num_hops=4)
    assert c.records["x"].num_hops == 4 and c.summary()["hops_mean"] == 4
    with pytest.raises(ValueError, match="twice"):
        c.on_arrival("x", 0.3, 1)
    with pytest.raises(KeyError):
        c.on_tokens("nope", 1, 0.3, 0)


def test_to_frame() -> None:
    df = _trace().to_frame()
    assert list(df["rid"]) == ["A", "B", "C", "D"]
    assert df["completed"].tolist() == [True, True, True, False]
    a = df.set_index("rid").loc["A"]
    assert (a["ttft_s"], a["e2e_s"], a["tpot_s"]) == approx((0.5, 1.1, 0.15))
    assert (a["tokens_model0"], a["tokens_model1"], a["num_hops"]) == (3, 2, 2)
    assert math.isnan(df.set_index("rid").loc["D", "finish_s"])


def test_importing_metrics_stays_light() -> None:
    code = "import sys, tokenrouter.metrics; assert not {'matplotlib', 'pandas'} & set(sys.modules), sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _is_png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_run(tmp_path: Path) -> None:
    out = tmp_path / "run.png"
    assert plot_run(_trace(), out, title="trace") == str(out)
    assert _is_png(out)
    plot_run(MetricsCollector(), tmp_path / "empty.png")  # nothing recorded still draws
    assert _is_png(tmp_path / "empty.png")


def test_plot_sweep(tmp_path: Path) -> None:
    df = pd.DataFrame(
        {"n": np.tile([1, 2, 4, 8], 2), "tput": np.arange(8.0), "policy": ["eager"] * 4 + ["delayed"] * 4}
    )
    plot_sweep(df, "n", "tput", "policy", tmp_path / "s.png", logx=True)
    plot_sweep(df, "n", "tput", None, tmp_path / "t.png")
    assert _is_png(tmp_path / "s.png") and _is_png(tmp_path / "t.png")
    with pytest.raises(KeyError, match="nope"):
        plot_sweep(df, "n", "nope", None, tmp_path / "u.png")
