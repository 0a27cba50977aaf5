"""Datasheet figures of the GPU kinds an estimated profile can target: vendor peaks in GB/s, dense BF16 TFLOP/s, GB,
SMs and the GPU-to-GPU link in bidirectional GB/s (sources: docs/calibration.md, The GPU table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from .profile import ProfileError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU kind; `name` as `torch.cuda.get_device_name` reports it (a measured profile's `gpu.name`)."""

    name: str
    mem_bw_gbs: float
    bf16_tflops: float
    memory_gb: float
    sms: int
    interconnect: str
    interconnect_gbs: float


GPU_SPECS: dict[str, GpuSpec] = {
    "h200": GpuSpec("NVIDIA H200", 4800.0, 989.0, 141.0, 132, "NVLink 4", 900.0),
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", 3350.0, 989.0, 80.0, 132, "NVLink 4", 900.0),
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", 2039.0, 312.0, 80.0, 108, "NVLink 3", 600.0),
    "l40s": GpuSpec("NVIDIA L40S", 864.0, 362.05, 48.0, 142, "PCIe Gen4 x16", 64.0),
    "l4": GpuSpec("NVIDIA L4", 300.0, 121.0, 24.0, 58, "PCIe Gen4 x16", 64.0),
}


def gpu_kind(name: str) -> str:
    """The table's key for a kind (`l4`) or a device name (`NVIDIA L4`), case-insensitive."""
    key = name.strip().lower()
    if key in GPU_SPECS:
        return key
    for kind, spec in GPU_SPECS.items():
        if spec.name.lower() == key:
            return kind
    raise ProfileError(f"unknown GPU kind {name!r}; known: {', '.join(GPU_SPECS)}")


def load_gpu_prices(text: str) -> dict[str, float]:
    """USD per GPU-hour by kind, from `KIND=USD,...` or a YAML file of that mapping (at the top or under
    `usd_per_gpu_hour`). No prices are built in: they change, and are the user's."""
    if "=" in text:
        pairs = [item.partition("=")[::2] for item in text.split(",") if item.strip()]
    else:
        try:
            raw = yaml.safe_load(Path(text).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ProfileError(f"--gpu-prices {text}: {str(e).splitlines()[0]}") from None
        raw = raw.get("usd_per_gpu_hour", raw) if isinstance(raw, dict) else raw
        if not isinstance(raw, dict):
            raise ProfileError(f"--gpu-prices {text}: expected a mapping of GPU kind to USD per hour")
        pairs = list(raw.items())
    prices = {}
    for kind, usd in pairs:
        try:
            price = float(usd)
        except (TypeError, ValueError):
            price = -1.0
        if not price >= 0:
            raise ProfileError(f"--gpu-prices: the price of {kind!r} must be a number of USD per hour >= 0, got "
                               f"{usd!r}")  # fmt: skip
        prices[gpu_kind(str(kind))] = price
    return prices


def usd_per_hour(kinds: Sequence[str], prices: dict[str, float]) -> float:
    """What GPUs of `kinds` (one entry per GPU) cost an hour."""
    if missing := [k for k in dict.fromkeys(kinds) if k not in prices]:
        raise ProfileError(f"--gpu-prices has no price for {', '.join(missing)} (in use); give KIND=USD_PER_HOUR")
    return sum(prices[k] for k in kinds)


def usd_per_mtok(usd_hour: float, tok_s: float) -> float:
    """USD per million output tokens of GPUs costing `usd_hour` an hour that write `tok_s` tokens a second."""
    return usd_hour / (tok_s * 3600.0) * 1e6 if tok_s > 0 else float("inf")
