"""Writing new tokens' K/V into the paged cache. Layout: per layer `k_cache`, `v_cache` are contiguous
`[num_pages, page_size, num_kv_heads, head_dim]`; position `pos` of a request lives at slot
`block_table[pos // page_size] * page_size + pos % page_size`. Page 0 is the null page (padding; never read)."""

from __future__ import annotations

import torch


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:  # fmt: skip
    """Write `k`, `v` (`[T, Hkv, D]`) into the caches at `slot_mapping` (`[T]`), in place, no host sync (graph-safe).
    Padded rows sharing a null-page slot land there in any order (page 0 is never read)."""
    if k.shape != v.shape or k.dim() != 3:
        raise ValueError(f"k and v must both be [T, Hkv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match k/v {tuple(k.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    # view() (not reshape) so a non-contiguous cache fails loudly instead of writing into a copy.
    k_flat = k_cache.view(num_slots, *k_cache.shape[2:])
    v_flat = v_cache.view(num_slots, *v_cache.shape[2:])
    index = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.to(torch.int64)
    k_flat.index_copy_(0, index, k.to(k_cache.dtype))
    v_flat.index_copy_(0, index, v.to(v_cache.dtype))
