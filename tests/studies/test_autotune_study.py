"""studies/autotune/run_autotune.py: the window and gap arithmetic the acceptance numbers come from (the live run
itself needs servers; README.md there has the CPU smoke command)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from study_script import load_study

STUDY = Path(__file__).resolve().parents[2] / "studies" / "autotune" / "run_autotune.py"


@pytest.fixture(scope="module")
def study():
    return load_study(STUDY)


def _sample(study, t, tokens=0.0, hop=None, b=None):
    return study.Sample(t, tokens, b, hop, 0.0, 0.0, 0.0, 0.0, None)


def test_window_rate_interpolates_the_counter(study):
    # 100 tok/s until t = 10, then 300 tok/s; polls at odd times so both ends fall between samples.
    ts = [0.0, 3.0, 7.5, 10.0, 12.5, 20.0]
    tok = [100 * t if t <= 10 else 1000 + 300 * (t - 10) for t in ts]
    assert study.window_rate(ts, tok, 1.0, 9.0) == pytest.approx(100.0)
    assert study.window_rate(ts, tok, 11.0, 19.0) == pytest.approx(300.0)
    # Straddling the change: (tokens at 15 - tokens at 5) / 10 = (2500 - 500) / 10.
    assert study.window_rate(ts, tok, 5.0, 15.0) == pytest.approx(200.0)
    assert study.window_rate(ts, tok, -1.0, 5.0) is None  # before the first poll
    assert study.window_rate(ts, tok, 15.0, 21.0) is None  # past the last poll
    assert study.window_rate(ts, tok, 5.0, 5.0) is None


def test_phase_starts_follow_the_hop_changes_in_order(study):
    # Server starts at the config's 0.1; the bench sets 0.05 (phase 0), 0.2 at ~45 s, 0.05 at ~90 s.
    hops = [0.1, 0.1, 0.05, 0.05, 0.2, 0.2, 0.05, 0.05]
    ts = [0.0, 1.0, 2.0, 3.0, 47.0, 48.0, 92.0, 93.0]
    samples = [_sample(study, t, hop=h) for t, h in zip(ts, hops, strict=True)]
    changes = study.hop_changes(samples)
    assert changes == [(1.5, 0.1, 0.05), (25.0, 0.05, 0.2), (70.0, 0.2, 0.05)]
    assert study.phase_starts(changes, [0.05, 0.2, 0.05]) == [1.5, 25.0, 70.0]
    # A run cut before the second shift: that phase is unseen, not matched to the first change to 0.05.
    assert study.phase_starts(changes[:2], [0.05, 0.2, 0.05]) == [1.5, 25.0, None]


def test_shift_windows_start_after_the_settle_time_and_end_with_the_phase(study):
    w = study.shift_windows([45.0, 90.0], phase_s=45.0, settle_s=30.0, end_t=200.0)
    assert w == [(75.0, 90.0), (120.0, 135.0)]
    # The bench ended 10 s into the second window; a run cut before it leaves it None.
    assert study.shift_windows([45.0, 90.0], 45.0, 30.0, end_t=130.0) == [(75.0, 90.0), (120.0, 130.0)]
    assert study.shift_windows([45.0, 90.0], 45.0, 30.0, end_t=120.5) == [(75.0, 90.0), None]
    assert study.shift_windows([45.0, None], 45.0, 30.0, end_t=200.0) == [(75.0, 90.0), None]


def test_gap_is_the_shortfall_against_the_best_static(study):
    assert study.gap(980.0, 1000.0) == pytest.approx(0.02)
    assert study.gap(1010.0, 1000.0) == pytest.approx(-0.01)  # faster than every static B
    assert study.gap(None, 1000.0) is None and study.gap(900.0, None) is None


def test_mode_b_takes_the_b_most_in_force(study):
    bs = [(1, 6), (1, 1), (1, 6), (1, 2), (1, 2), (1, 2), (1, 1)]
    samples = [_sample(study, float(t), b=b) for t, b in enumerate(bs)]
    assert study.mode_b(samples, 0.0, 2.0) == (1, 6)
    assert study.mode_b(samples, 2.5, 6.0) == (1, 2)
    assert study.mode_b(samples, 10.0, 20.0) is None


def test_timeline_text_parses(study):
    assert study._parse_timeline("0:1,6;41.0:1,2") == [(0.0, (1, 6)), (41.0, (1, 2))]
    assert study._parse_timeline(None) == []
    assert not math.isnan(study.gap(1.0, 2.0))


def test_a_phase_that_keeps_the_hop_rate_starts_a_phase_after_the_previous_one(study):
    # The N ramp: every phase at hop 0.1; the server saw only the first (the bench's phase 0 moved it from 0.2).
    samples = [_sample(study, t, hop=h) for t, h in ((0.0, 0.2), (1.0, 0.2), (2.0, 0.1), (50.0, 0.1), (95.0, 0.1))]
    starts = study.phase_starts(study.hop_changes(samples), [0.1, 0.1, 0.1])
    assert starts == [1.5, None, None]
    assert study.fill_starts(starts, [0.1, 0.1, 0.1], 45.0) == [1.5, 46.5, 91.5]
    # A phase whose hop rate changed but was not seen (the run was cut) stays unknown, and so does what follows.
    assert study.fill_starts([1.5, None, None], [0.05, 0.2, 0.2], 45.0) == [1.5, None, None]
    assert study.fill_starts([None, None], [0.1, 0.1], 45.0) == [None, None]


def test_regime_keys_keep_the_first_runs_hop_keys_at_n_8(study):
    assert study.regime_key(0.05, study.N) == "0.05"
    assert study.regime_key(0.1, 16) == "0.1@N=16"
    assert study.regime_key(0.1, 4) != study.regime_key(0.1, 16)


def test_requests_the_study_cut_are_not_lost(study):
    # The study stopped the bench after the last phase: its 8 in-flight requests were cut by the study.
    rec = {"requests_unfinished": 8, "requests_failed": 0}
    assert study.lost_count(True, rec, 0.0)[0] == 0
    assert study.lost_count(True, {"requests_unfinished": 8, "requests_failed": 3}, 3.0)[0] == 3
    # A bench that ended by itself: whatever it sent and did not complete is lost.
    assert study.lost_count(False, rec, 0.0)[0] == 8
    assert study.lost_count(False, {"requests_unfinished": 1, "requests_failed": 2}, None)[0] == 2
    # Without the bench's JSON, the server's error outcomes are the only count.
    assert study.lost_count(True, None, 5.0)[0] == 5
    assert study.lost_count(False, None, None)[0] is None


def test_alternation_cost_compares_the_means_of_each_kind(study):
    # ABBA: autotune 1,000 and 980, static 1,010 and 1,000 -> cost 1 - 990 / 1,005.
    w = [("autotune", 1000.0), ("static", 1010.0), ("static", 1000.0), ("autotune", 980.0)]
    got = study.alternation_cost(w)
    assert got["autotune_tok_s"] == pytest.approx(990.0) and got["static_tok_s"] == pytest.approx(1005.0)
    assert got["cost"] == pytest.approx(1 - 990 / 1005) and got["windows_measured"] == 4
    # An unmeasured window is left out; without one kind there is no cost.
    assert study.alternation_cost([("autotune", 1000.0), ("static", None), ("static", 900.0)])["cost"] == (
        pytest.approx(1 - 1000 / 900)
    )
    assert study.alternation_cost([("autotune", 1000.0), ("static", None)]) is None


def test_candidates_flat_or_per_hop_rate(study):
    assert study.parse_candidates("1,6;2,7", [0.2, 0.05]) == {0.2: [(1, 6), (2, 7)], 0.05: [(1, 6), (2, 7)]}
    got = study.parse_candidates("0.2:2,7;3,6 0.05:4,5", [0.2, 0.05, 0.1])
    assert got == {0.2: [(2, 7), (3, 6)], 0.05: [(4, 5)]}
    with pytest.raises(ValueError):
        study.parse_candidates("0.2:2,x", [0.2])


def test_in_bench_phase_compares_the_autotune_mean_with_the_best_static_window():
    load_study(STUDY)  # puts studies/autotune on the path, as running the script does
    ib = load_study("studies/autotune/in_bench.py")
    plan = ib.window_plan([(2, 7), (3, 6)])
    assert plan == [("autotune", None), ("static", (2, 7)), ("static", (3, 6)), ("autotune", None)]
    windows = [{"kind": "autotune", "B": "2,7", "tok_s": 1000.0}, {"kind": "static", "B": "2,7", "tok_s": 1050.0},
               {"kind": "static", "B": "3,6", "tok_s": 1010.0}, {"kind": "autotune", "B": "2,7", "tok_s": 1040.0},
               {"kind": "static", "B": "4,5", "tok_s": None}]  # fmt: skip
    got = ib.phase_result(windows)
    assert got["autotune_tok_s"] == 1020.0 and got["best_static_B"] == "2,7"
    assert got["gap"] == pytest.approx(1 - 1020 / 1050) and set(got["static_tok_s"]) == {"2,7", "3,6"}
    assert ib.phase_result([{"kind": "static", "B": "2,7", "tok_s": 1.0}])["gap"] is None


def test_the_acceptance_keys_come_from_both_in_bench_runs():
    load_study(STUDY)
    ib = load_study("studies/autotune/in_bench.py")

    def run(gaps, lost):
        return {"phases": [{"gap": g} for g in gaps], "lost_requests": lost, "lost_requests_source": "bench"}

    summary = {"in_bench": run([0.005, -0.01, 0.019], 0.0), "in_bench_n_ramp": run([0.04, 0.015, None], 1.0)}
    ib.fill_acceptance(summary)
    # Phase 0 of each run is its start, not a shift: the ramp's 0.04 is no gap after a shift.
    assert summary["worst_gap_after_shift"] == 0.019 and summary["stable_cost"] == 0.005
    assert summary["lost_requests"] == 1.0
    summary["in_bench_n_ramp"]["lost_requests"] = None
    ib.fill_acceptance(summary)
    assert summary["lost_requests"] is None  # an unknown count is not zero
