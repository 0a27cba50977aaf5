"""The standard-serving micro-benchmark of `tr calibrate`: its fit, and that it runs the baseline's prefix cache."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.profiler import std_serving


def test_the_per_hop_cost_is_a_line_through_the_measured_visits(monkeypatch):
    monkeypatch.setattr(std_serving, "visit_ms", lambda n, visits: 0.04 + 0.015 * n / 1000)
    got = std_serving.measure_std_serving()
    assert got.hop_overhead_ms == pytest.approx(0.04, abs=1e-6)
    assert got.hop_overhead_ms_per_ktok == pytest.approx(0.015, abs=1e-6)


def test_a_falling_line_is_noise_and_keeps_the_cheapest_visit(monkeypatch):
    monkeypatch.setattr(std_serving, "visit_ms", lambda n, visits: 0.05 - 0.001 * n / 1000)
    got = std_serving.measure_std_serving(prefix_lens=(128, 8192))
    assert got.hop_overhead_ms_per_ktok == 0.0 and got.hop_overhead_ms == pytest.approx(0.05 - 0.001 * 8.192)


def test_a_visit_rematches_whole_pages_and_gives_every_page_back(monkeypatch):
    from tokenrouter.baselines import kv

    matched: list[tuple[int, int]] = []
    admit = kv.PrefixCaching.admit

    def spy(self, req):
        n = admit(self, req)
        matched.append((len(req.token_ids), n))
        return n

    monkeypatch.setattr(kv.PrefixCaching, "admit", spy)
    pools: list[kv.RefCountedKVPool] = []
    init = kv.RefCountedKVPool.__init__

    def keep(self, *a):
        init(self, *a)
        pools.append(self)

    monkeypatch.setattr(kv.RefCountedKVPool, "__init__", keep)
    assert std_serving.visit_ms(100, visits=5) > 0
    # The first sequence finds nothing; each visit (100 + 10 tokens) finds the 6 whole pages of the 100 cached.
    assert matched == [(100, 0)] + [(110, 96)] * 5
    pool = pools[0]
    # Every visit gave its pages back: only the cache still holds any, once each.
    assert max(pool.refs) == 1 and pool.num_free + sum(pool.refs) == pool.num_pages - 1
