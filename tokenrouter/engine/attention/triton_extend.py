"""Paged extend/prefill attention in Triton (causal, packed variable-length queries; docs/engine.md, Kernels).
CUDA graphs pass `max_q_len` (the bucket's bound): grid and splits then depend only on shapes, no host sync."""

from __future__ import annotations

import torch
import triton

from tokenrouter.engine.attention.triton_common import (
    EXTEND_CONFIG,
    EXTEND_MAX_DYN_SPLITS,
    MIN_DOT_DIM,
    KernelConfig,
    can_fuse_merge,
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
                            row_slots: torch.Tensor | None = None, counters: torch.Tensor | None = None,
                            split_keys: int = 0, split_programs: int = 0) -> torch.Tensor:  # fmt: skip
    """Packed q `[T, Hq, D]`; row b owns tokens `cu_seqlens_q[b]:cu_seqlens_q[b+1]`, the last of which sits at
    position `seq_lens[b] - 1`. Tokens outside every row are left untouched in `out`. `counters`: as in decode
    (`attention.split_counters`), used where the query blocks are short (`launch_paged_attention`).

    `split_keys` > 0 where the splits merge in the kernel (`counters`, short query blocks): the split count follows
    each query block's context on the device, one split per `split_keys` keys, the grid sized for the block table's
    width (at most EXTEND_MAX_DYN_SPLITS). The shape-only rule cannot: a varlen graph's short group has 64 row slots,
    so it assumes 64 busy rows and walks a few long rows' 8k keys in one split each. `split_programs` > 0 caps the
    splits further, at about that many programs over the launch's busy query blocks (counted on the device)."""
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
    programs = num_rows * num_kv_heads * num_q_blocks
    if split_keys < 0:
        raise ValueError(f"split_keys must be >= 0, got {split_keys}")
    if split_programs < 0:
        raise ValueError(f"split_programs must be >= 0, got {split_programs}")
    dyn = split_keys > 0 and can_fuse_merge(counters, programs, False, block_q)
    if num_splits is None:
        max_kv_len = block_tables.shape[1] * k_cache.shape[1]
        if dyn:
            num_splits = max(1, min(EXTEND_MAX_DYN_SPLITS, triton.cdiv(max_kv_len, split_keys)))
        else:
            num_splits = choose_num_splits(programs, max_kv_len, num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return launch_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, out,
        num_rows=num_rows, block_q=block_q, group_pad=group_pad,
        num_q_blocks=num_q_blocks, num_splits=num_splits, config=config, pdl=pdl, row_slots=row_slots,
        counters=counters, split_keys=split_keys if dyn else 0, split_programs=split_programs if dyn else 0,
    )  # fmt: skip
