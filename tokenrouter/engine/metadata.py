"""`AttentionMetadata`: what every attention layer of one step needs, passed explicitly (no global context).
Decode layout (`cu_seqlens_q is None`): one query per row (graph steps: one virtual decode row per token); extend
layout: packed causal queries (`attention.extend_attention`). The step's K/V are stored before attention reads."""

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
    split_counters: torch.Tensor | None = None  # Triton decode: the fused split merge's zeroed arrival counters
    extend_counters: torch.Tensor | None = None  # the same for extend launches (`extend_fused_reduce`), or None
    pdl: bool = False  # Triton attention launches with programmatic dependent launch
    # `EngineConfig.decode_fused_rope`: decode attention norms, rotates and stores q/k/v itself from the raw qkv rows
    # (`attention.decode_attention_fused_rope`), rows of up to this many tokens of one request sharing a row slot
    # (`graph_max_row_tokens`); 0: off.
    fused_rope_rows: int = 0
    # [R] int32: attention row r reads page-table row `row_slots[r]` of `block_tables`; None: row r.
    row_slots: torch.Tensor | None = None
    # Varlen graphs (`varlen_shapes`): rows 0..long_rows-1 attend with `max_q_len`, the rest in a second launch with
    # `short_q_len`. None: one launch.
    long_rows: int | None = None
    short_q_len: int = 1
    short_split_keys: int = 0  # the short group's dynamic splits (`EngineConfig.extend_split_keys`; 0: shape rule)
    short_split_programs: int = 0  # their cap in programs (`EngineConfig.extend_split_programs`; 0: none)
    short_block_m: int = 0  # the short group's tile query rows (`EngineConfig.extend_short_block_m`; 0: default)

    @property
    def is_decode(self) -> bool:
        return self.cu_seqlens_q is None
