"""Paged KV storage of one engine: one allocation [layers, 2, pages, page_size, kv_heads, head_dim], layer l's
`k = kv[l, 0]`, `v = kv[l, 1]` (layout: `attention.kv_store`); page ids come from the shared `KVPool`."""

from __future__ import annotations

import torch

from tokenrouter.core.kv import KVPool
from tokenrouter.models.spec import ModelSpec


def kv_bytes_per_page(spec: ModelSpec, page_size: int, dtype: torch.dtype, tp: int = 1) -> int:
    """Bytes of one page on one rank (a rank of `tp` holds 1/tp of the KV heads)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * page_size * (spec.num_kv_heads // tp) * spec.head_dim * itemsize


class KVCache:
    """K/V pages of every layer, zero-filled (a kernel reading a whole page sees no NaN); this rank's KV heads."""

    def __init__(self, spec: ModelSpec, pool: KVPool, *, device: torch.device, dtype: torch.dtype,
                 tp: int = 1) -> None:  # fmt: skip
        self.num_pages = pool.num_pages
        self.page_size = pool.page_size
        shape = (spec.num_layers, 2, pool.num_pages, pool.page_size, spec.num_kv_heads // tp, spec.head_dim)
        self.kv = torch.zeros(shape, device=device, dtype=dtype)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [(self.kv[i, 0], self.kv[i, 1]) for i in range(shape[0])]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()
