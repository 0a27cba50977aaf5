"""studies/calibration/std_serving_cache.py times what it claims to: each returning visit re-matches the whole
cached prefix (all full pages but the last, which the tree never holds for a sequence that grew past it), not a
cold miss. Reference: the page arithmetic of the sequence lengths, not the cache's own counters."""

from __future__ import annotations

from pathlib import Path

from study_script import load_study

STUDY = Path(__file__).resolve().parents[2] / "studies" / "calibration" / "std_serving_cache.py"


def _study():
    return load_study(STUDY)


def test_every_visit_rematches_the_prefix_its_previous_visit_cached():
    m = _study()
    prefix, visits, ps = 256, 12, m.PAGE_SIZE
    times, matched = m.visit_times(prefix, visits)
    assert len(times) == visits and all(t > 0 for t in times)
    for v, got in enumerate(matched):
        before = prefix + m.PEER_RUN * v  # the sequence as its previous visit left it (cached in whole pages)
        now = before + m.PEER_RUN
        # The match stops at whole cached pages and leaves at least the last token to compute.
        assert got == min(before // ps, (now - 1) // ps) * ps, (v, got)


def test_the_fit_is_a_line_through_the_medians():
    m = _study()
    out = m.measure(prefix_tokens=(256, 1024), visits=5)
    assert set(out["points"]) == {"256", "1024"}
    a, b = out["hop_overhead_ms"], out["hop_overhead_ms_per_ktok"]
    # Two points: the line passes through both (unless a clip at 0 moved it).
    if a > 0 and b > 0:
        for n, ms in out["points"].items():
            assert abs(a + b * int(n) / 1000 - ms) < 1e-3, out
