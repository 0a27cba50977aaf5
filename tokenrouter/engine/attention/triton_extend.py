"""Paged extend/prefill attention in Triton (causal, packed variable-length queries; docs/engine.md, Kernels).
CUDA graphs pass `max_q_len` (the bucket's bound): grid and splits then depend only on shapes, no host sync."""

from __future__ import annotations

import torch
import triton

from tokenrouter.engine.attention.triton_common import (
    EXTEND_CONFIG,
    MIN_DOT_DIM,
    KernelConfig,
    choose_num_splits,
    launch_paged_attention,
    num_sms,
)


def extend_tiling(max_q_len: int, group: int, config: KernelConfig) -> tuple[int, int]:
    """(BLOCK_Q, GROUP_PAD): query tokens per tile (at most the largest row's) and the padded group, product >= 16."""
    group_pad = triton.next_power_of_2(group)
    min_q = max(1, MIN_DOT_DIM // group_pad)
    block_q = max(min_q, min(max(1, config.block_m // group_pad), triton.next_power_of_2(max(1, max_q_len))))
    return block_q, group_pad


def extend_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                            max_q_len: int | None = None, out: torch.Tensor | None = None,
                            num_splits: int | None = None, config: KernelConfig = EXTEND_CONFIG, pdl: bool = False,
                            row_slots: torch.Tensor | None = None,
                            counters: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Packed q `[T, Hq, D]`; row b owns tokens `cu_seqlens_q[b]:cu_seqlens_q[b+1]`, the last of which sits at
    position `seq_lens[b] - 1`. Tokens outside every row are left untouched in `out`. `counters`: as in decode
    (`attention.split_counters`), used where the query blocks are short (`launch_paged_attention`)."""
    num_rows = seq_lens.shape[0]
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if cu_seqlens_q.shape != (num_rows + 1,) or (row_slots is None and block_tables.shape[0] != num_rows):
        raise ValueError(
            f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} / block_tables {tuple(block_tables.shape)} "
            f"do not match {num_rows} rows"
        )
    if max_q_len is None:
        # Host sync: fine eagerly, not under graph capture (callers capturing pass the bucket's value).
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_rows else 0
    if out is None:
        out = torch.empty_like(q)
    if max_q_len <= 0:
        return out
    block_q, group_pad = extend_tiling(max_q_len, num_heads // max(num_kv_heads, 1), config)
    num_q_blocks = triton.cdiv(max_q_len, block_q)
    if num_splits is None:
        max_kv_len = block_tables.shape[1] * k_cache.shape[1]
        num_splits = choose_num_splits(num_rows * num_kv_heads * num_q_blocks, max_kv_len, num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return launch_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, out,
        num_rows=num_rows, block_q=block_q, group_pad=group_pad,
        num_q_blocks=num_q_blocks, num_splits=num_splits, config=config, pdl=pdl, row_slots=row_slots,
        counters=counters,
    )  # fmt: skip
