"""The cross-host link measurement (`calibration.profiler.link`, `tokenrouter link-probe`, `tokenrouter calibrate
--link`) over loopback: structure and sanity of what it writes, never timing thresholds; and the simulator pricing
cross-host messages from the measured (or the config's) link."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("zmq")

from tokenrouter.calibration import load_profile
from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.profiler.link import apply_link, measure_link, probe_address, serve_probe
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PlacementConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def probe():
    """An in-process probe on a free loopback port; its connect address."""
    stop = threading.Event()
    bound: list[str] = []
    t = threading.Thread(target=serve_probe, args=("tcp://127.0.0.1:*",),
                         kwargs=dict(stop=stop.is_set, on_ready=bound.append), daemon=True)  # fmt: skip
    t.start()
    deadline = time.monotonic() + 10
    while not bound and time.monotonic() < deadline:
        time.sleep(0.01)
    yield bound[0]
    stop.set()
    t.join(5)


def test_measure_link_reports_latency_and_bandwidth(probe):
    r = measure_link(probe, small=200, bulk_bytes=1 << 20, count=8, rounds=3)
    assert r["address"] == probe and r["small_messages"] == 200 and r["bulk_bytes"] == 1 << 20
    assert 0 < r["rtt_ms_p10"] <= r["rtt_ms_median"] <= r["rtt_ms_p90"]
    assert r["latency_ms"] == pytest.approx(r["rtt_ms_median"] / 2)  # one way
    assert len(r["bandwidth_gbps_rounds"]) == 3 and all(g > 0 for g in r["bandwidth_gbps_rounds"])
    assert min(r["bandwidth_gbps_rounds"]) <= r["bandwidth_gbps"] <= max(r["bandwidth_gbps_rounds"])


def test_no_probe_is_a_clear_timeout():
    with pytest.raises(TimeoutError, match="link-probe --listen"):
        measure_link(f"tcp://127.0.0.1:{free_port()}", timeout_s=0.5)


def test_probe_addresses():
    assert probe_address(":5599") == ("tcp://*:5599", "tcp://127.0.0.1:5599")
    assert probe_address("10.0.0.2:80") == ("tcp://10.0.0.2:80", "tcp://10.0.0.2:80")
    assert probe_address("tcp://h:1") == ("tcp://h:1", "tcp://h:1")
    for bad in ("5599", "h:", "h:0", "h:70000"):
        with pytest.raises(ValueError):
            probe_address(bad)


def test_the_measured_link_prices_cross_host_messages_and_round_trips(tmp_path):
    base = load_profile("h200")
    result = {"latency_ms": 0.25, "bandwidth_gbps": 12.5, "rtt_ms_median": 0.5, "address": "tcp://x:1"}
    prof = apply_link(base, result)
    assert (prof.link.latency_ms, prof.link.bandwidth_gbps) == (0.25, 12.5)
    assert prof.notes["link"]["address"] == "tcp://x:1" and prof.models == base.models
    prof.save(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == prof
    # latency + bytes / bandwidth, computed by hand: 1e6 bytes at 12.5 Gbit/s are 0.64 ms.
    assert CostModel(again, "cross-host").message_ms(1_000_000) == pytest.approx(0.25 + 0.64)
    assert CostModel(again, "separate").message_ms(1_000_000) == CostModel(base, "separate").message_ms(1_000_000)


def test_the_configs_link_overrides_the_profiles_in_the_simulator():
    from tokenrouter.sim.run import cost_model

    models = [ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-8b")]
    dep = DeploymentConfig(models=models, placement=PlacementConfig("cross-host", link_latency_ms=2.0))
    cm = cost_model(dep, load_profile("h200"))
    bw = load_profile("h200").link.bandwidth_gbps  # not overridden: the profile's
    assert cm.message_ms(1000) == pytest.approx(2.0 + 1000 * 8 / (bw * 1e9) * 1e3)


@pytest.mark.runtime
def test_link_probe_and_calibrate_link_cli(tmp_path):
    """The two commands a user runs, as processes: the probe on a port, `calibrate --link` into a profile."""
    port = free_port()
    tr = [sys.executable, "-m", "tokenrouter.cli.tr"]
    probe = subprocess.Popen([*tr, "link-probe", "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        assert "listening on tcp://127.0.0.1:" in probe.stdout.readline()
        out = tmp_path / "prof.json"
        cal = [*tr, "calibrate", "--link", f"127.0.0.1:{port}", "-o", str(out)]
        missing = subprocess.run(cal, capture_output=True, text=True, timeout=120)
        assert missing.returncode == 2 and "--link-base" in missing.stderr  # nothing to update yet
        r = subprocess.run([*cal, "--link-base", "h200"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        raw = json.loads(out.read_text())
        prof = load_profile(out)
        assert prof.link.latency_ms > 0 and prof.link.bandwidth_gbps > 0
        assert raw["notes"]["link"]["address"] == f"tcp://127.0.0.1:{port}"
        assert prof.link.latency_ms == pytest.approx(raw["notes"]["link"]["latency_ms"], rel=1e-3)
        assert prof.models.keys() == load_profile("h200").models.keys()
    finally:
        os.killpg(probe.pid, signal.SIGTERM)
        assert probe.wait(timeout=10) == 0
