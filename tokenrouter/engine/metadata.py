"""`AttentionMetadata`: what every attention layer of one step needs, passed explicitly (no global context).

Decode layout (`cu_seqlens_q is None`): one query per attention row; graph steps run small extend rows this way,
one "virtual decode" row per token (seq_len = position + 1), so every graph stays on the graph-safe decode kernel.
Extend layout: packed causal variable-length queries, query i of row b at position `seq_lens[b] - q_len_b + i`.
The step's own K/V are stored through `slot_mapping` before attention reads the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int32/int64: page * page_size + offset for every fed token (0 for padding)
    block_tables: torch.Tensor  # [R or slots, W] int32 page tables (see row_slots; unused tail: any page)
    seq_lens: torch.Tensor  # [R] int32 KV length per attention row, including this step's tokens
    cu_seqlens_q: torch.Tensor | None = None  # [R+1] int32 (extend layout) or None (decode layout)
    max_q_len: int = 1
    num_splits: int | None = None
    backend: str = "auto"
    # Triton decode: zeroed per-engine arrival counters ([rows * Hkv] int32) turn on the fused split merge.
    split_counters: torch.Tensor | None = None
    pdl: bool = False  # Triton attention launches with programmatic dependent launch
    # [R] int32: attention row r reads page-table row `row_slots[r]` of `block_tables` (the engine's persistent
    # per-request slots); None: row r reads row r.
    row_slots: torch.Tensor | None = None
    # Varlen graphs (extend layout, see `varlen_shapes`): rows 0..long_rows-1 attend with `max_q_len`, the rest
    # (at most `short_q_len` queries each) in a second launch with `short_q_len`. None: one launch.
    long_rows: int | None = None
    short_q_len: int = 1

    @property
    def is_decode(self) -> bool:
        return self.cu_seqlens_q is None
