"""Memory sizing from measurement and the engine's memory report (docs/engine.md, Start-up and memory). It reads
the device's caching-allocator counters, so engines of one process are built one after another."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

MIB = 1 << 20


@dataclass(slots=True)
class MemoryProfile:
    """Bytes measured (or, on CPU, computed) before the KV cache is allocated."""

    weights: int
    activation_peak: int  # the larger of the eager pass's and the largest graph bucket's transient peak
    static: int  # graph static buffers, page table, output buffers, split counters
    graph_pool: int = 0  # varlen graphs: the pool keeps about one activation peak beside the eager pass's


def kv_bytes_for_budget(budget: int, profile: MemoryProfile, margin_frac: float = 0.02) -> int:
    """KV bytes that fit `budget` next to the profile's needs, less a margin."""
    margin = int(margin_frac * budget) + 64 * MIB
    return budget - profile.weights - profile.activation_peak - profile.graph_pool - profile.static - margin


@dataclass(slots=True)
class MemoryReport:
    """What the engine holds on its device after start-up (bytes; `None` where not measurable, e.g. CPU)."""

    device: str
    budget: int | None
    weights: int
    kv_cache: int
    num_pages: int
    page_table: int
    graph_static: int  # static buffers of the decode and varlen graphs
    decode_graphs: int  # captured graphs (0 in emulation)
    varlen_graphs: int
    graph_pool: int | None  # reserved by graph capture (one pool for both kinds) beyond the static buffers
    activation_peak: int | None  # measured transient peak of the profile passes
    total_allocated: int | None  # allocator's view after start-up (all engines of the process)
    total_reserved: int | None
    device_total: int | None

    def as_dict(self) -> dict[str, int | str | None]:
        return asdict(self)

    def summary(self) -> str:
        def g(x: int | None) -> str:
            return "-" if x is None else f"{x / (1 << 30):.2f}G"

        return (f"weights {g(self.weights)} kv {g(self.kv_cache)} ({self.num_pages} pages) graphs "
                f"{g(self.graph_static)}+pool {g(self.graph_pool)} ({self.decode_graphs}+{self.varlen_graphs}) "
                f"act.peak {g(self.activation_peak)} "
                f"budget {g(self.budget)}")  # fmt: skip


class DeviceMemory:
    """Allocator counters of one device (zeros on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device) if self.cuda else 0

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else 0

    def total(self) -> int | None:
        return torch.cuda.get_device_properties(self.device).total_memory if self.cuda else None
