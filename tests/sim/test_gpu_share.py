"""Processor sharing of one GPU (sim/gpu_share.py) and the simulator's co-located passes, against timelines
computed by hand."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.interference import Interference, interp2
from tokenrouter.sim.gpu_share import GpuPass, SharedGpu


def _gpu(factor: float = 2.0, cap: float = 1.0) -> tuple[SharedGpu, list[int]]:
    retimed: list[int] = []
    return SharedGpu(lambda m, own, p, pt: factor, lambda m, own: cap), retimed


def test_two_passes_slow_each_other_while_they_overlap():
    # A: 10 ms of work from t=0; B: 4 ms from t=2 ms; factor 2 while both run.
    # By hand: A alone 0-2 (2 ms done); both at half rate: B needs 8 ms -> ends at 10, A has 2 + 4 = 6 done;
    # then A alone: 4 ms left -> ends at 14.
    gpu, retimed = _gpu()
    a = GpuPass(0, 1, 10.0, lambda: retimed.append(0))
    b = GpuPass(1, 1, 4.0, lambda: retimed.append(1))
    gpu.start(a, 0.0)
    assert a.remaining_s(0.0) == pytest.approx(0.010)
    gpu.start(b, 0.002)
    assert retimed == [0]  # A's end moved; B was just started (its subserver reads its rate)
    assert b.remaining_s(0.002) == pytest.approx(0.008)
    assert a.remaining_s(0.002) == pytest.approx(0.016)  # 8 ms of work at half rate
    gpu.end(b, 0.010)
    assert a.done_ms == pytest.approx(6.0)
    assert a.remaining_s(0.010) == pytest.approx(0.004)
    assert retimed == [0, 0]


def test_sm_cap_slows_a_pass_alone():
    gpu, _ = _gpu(cap=1.5)
    a = GpuPass(0, 1, 3.0, lambda: None)
    gpu.start(a, 1.0)
    assert a.remaining_s(1.0) == pytest.approx(0.0045)


def test_same_model_passes_do_not_interfere():
    # One subserver runs one pass at a time, but two passes of one model must never slow each other.
    gpu, _ = _gpu()
    a, b = GpuPass(0, 1, 2.0, lambda: None), GpuPass(0, 1, 2.0, lambda: None)
    gpu.start(a, 0.0)
    gpu.start(b, 0.0)
    assert a.rate == b.rate == 1.0


def test_interference_interpolates_in_log2_batch():
    # corun[own][other] at own in {1, 4}, other in {1, 16}; reference 1.0 and 2.0 ms; by hand at own=2 (halfway
    # in log2), other=4 (halfway): bilinear of 1.5, 1.2, 3.0, 2.4 -> mean 2.025 over ref 1.5 = 1.35.
    f = Interference([0.0, 2.0], [0.0, 4.0], ref=[1.0, 2.0], alone=[1.1, 2.2], corun=[[1.5, 1.2], [3.0, 2.4]])
    assert f.factor(2, 4) == pytest.approx(((1.5 + 1.2) / 2 + (3.0 + 2.4) / 2) / 2 / 1.5)
    assert f.factor(1, 1) == pytest.approx(1.5)
    assert f.factor(64, 64) == pytest.approx(1.2)  # clamped at the far corner: 2.4 / 2.0
    assert f.cap(4) == pytest.approx(1.1)
    assert interp2([0.0], [0.0], [[7.0]], 3.0, 5.0) == 7.0
