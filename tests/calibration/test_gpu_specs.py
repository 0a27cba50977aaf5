"""`calibration/gpus.py` against the vendors' published figures, written as the datasheets print them (TB/s, BF16
"with sparsity", which is twice the dense rate the table keeps), and the price arithmetic by hand. Sources:
docs/calibration.md, "Estimated profiles for other GPUs"."""

from __future__ import annotations

import pytest

from tokenrouter.calibration.gpus import GPU_SPECS, usd_per_hour, usd_per_mtok

# kind: (memory GB, bandwidth TB/s, dense BF16 TFLOP/s, SMs, GPU-to-GPU link GB/s)
DATASHEETS = {
    "h200": (141, 4.8, 1979 / 2, 132, 900),  # NVLink 4; BF16 1,979 with sparsity
    "h100": (80, 3.35, 1979 / 2, 132, 900),  # SXM, NVLink 4; BF16 1,979 with sparsity
    "a100": (80, 2.039, 624 / 2, 108, 600),  # 80GB SXM, NVLink 3; BF16 312 dense, 624 with sparsity
    "l40s": (48, 0.864, 362.05, 142, 64),  # no NVLink: PCIe Gen4 x16, 64 GB/s both ways; BF16 362.05 dense
    "l4": (24, 0.300, 242 / 2, 58, 64),  # PCIe Gen4 x16; BF16 242 with sparsity
}


@pytest.mark.parametrize("kind", sorted(DATASHEETS))
def test_each_gpu_carries_its_datasheet_figures(kind: str) -> None:
    memory_gb, tb_s, dense_tflops, sms, link_gb_s = DATASHEETS[kind]
    g = GPU_SPECS[kind]
    assert g.memory_gb == pytest.approx(memory_gb)
    assert g.mem_bw_gbs == pytest.approx(tb_s * 1000)
    assert g.bf16_tflops == pytest.approx(dense_tflops, rel=1e-3)  # the table rounds 989.5 to 989
    assert g.sms == sms and g.interconnect_gbs == pytest.approx(link_gb_s)


def test_the_table_holds_the_kinds_the_datasheets_cover() -> None:
    assert set(GPU_SPECS) == set(DATASHEETS)


def test_prices_add_per_gpu_and_turn_into_usd_per_million_tokens() -> None:
    # Two H200s at $4 and an L4 at $0.50 an hour: $8.50 an hour.
    assert usd_per_hour(["h200", "h200", "l4"], {"h200": 4.0, "l4": 0.5}) == pytest.approx(8.5)
    # $3.60 an hour writing 1,000 tokens a second: 3.6 million tokens an hour, so $1 per million tokens.
    assert usd_per_mtok(3.6, 1000.0) == pytest.approx(1.0)
    assert usd_per_mtok(3.6, 0.0) == float("inf")
