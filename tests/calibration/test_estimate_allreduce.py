"""An estimated profile carries a measured all-reduce to the target by the interconnect ratio (calibration/estimate.py).
The bundled profile measured none, so the anchor here is the bundled h200 with one added. References by hand."""

from __future__ import annotations

import msgspec
import pytest

from tokenrouter.calibration.estimate import estimate_profile
from tokenrouter.calibration.profile import AllReduceInfo, Profile
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.calibration.tensor_parallel import AllReduceCost, estimate_tp
from tokenrouter.models.spec import load_spec

# Measured on the H200's NVLink 4 (900 GB/s): 20 us a call and 360 GB/s of bus bandwidth, at 4 ranks.
MEASURED = AllReduceInfo(latency_ms=0.02, bus_bandwidth_gbs=360.0, measured_tp=4)


@pytest.fixture(scope="module")
def anchor() -> Profile:
    return msgspec.structs.replace(load_profile("h200"), allreduce=MEASURED)


@pytest.mark.parametrize(
    ("kind", "bus_gbs"),
    [
        ("l4", 360.0 * 64 / 900),  # PCIe Gen4 x16, 64 GB/s: 25.6 GB/s, 14 times slower than NVLink 4
        ("a100", 360.0 * 600 / 900),  # NVLink 3, 600 GB/s: 240 GB/s
        ("h100", 360.0),  # NVLink 4 as well: unchanged
    ],
)
def test_a_slower_link_gives_a_slower_allreduce(anchor: Profile, kind: str, bus_gbs: float) -> None:
    ar = estimate_profile(anchor, kind).allreduce
    assert ar is not None
    assert ar.bus_bandwidth_gbs == pytest.approx(bus_gbs)
    assert (ar.latency_ms, ar.measured_tp) == (0.02, 4)  # latency is kept, as launch is


def test_the_l4s_tp2_step_pays_its_allreduces_at_the_pcie_rate(anchor: Profile) -> None:
    # Qwen3-0.6B at tp = 2: 2 all-reduces per layer x 28 layers = 56 a step, each of hidden 1,024 bf16 values =
    # 2,048 bytes per token fed, sent 2(tp-1)/tp = 1 times over 25.6 GB/s: 56 x 2,048 / 25.6e9 s = 4.48 us a token.
    l4 = estimate_profile(anchor, "l4")
    base = l4.models["qwen3-0.6b"]
    est = estimate_tp(base, load_spec("qwen3-0.6b"), 2, AllReduceCost.of(l4.allreduce), "qwen3-0.6b").entry
    assert est.step.graph.c_tok - base.step.graph.c_tok / 2 == pytest.approx(56 * 2048 / 25.6e9 * 1e3)
