"""Split-KV ("flash-decoding") paged decode attention in Triton: grid (B, Hkv, num_splits), splits merged by
log-sum-exp in-kernel (arrival `counters`) or in a reduce kernel; no host reads (docs/engine.md, Kernels)."""

from __future__ import annotations

import torch
import triton

from tokenrouter.engine.attention.triton_common import (
    MIN_DOT_DIM,
    KernelConfig,
    choose_num_splits,
    decode_config,
    launch_paged_attention,
    num_sms,
)

# The programs an SM the split choice aims at; read at each launch, so a study can change it between captures.
DECODE_PROGRAMS_PER_SM = 4


def decode_num_splits(batch: int, num_kv_heads: int, max_pages: int, page_size: int, device: torch.device) -> int:
    """The split count `decode_attention_triton` uses when none is given (exposed for benchmarks/graphs)."""
    return choose_num_splits(batch * num_kv_heads, max_pages * page_size, num_sms(device),
                             programs_per_sm=DECODE_PROGRAMS_PER_SM)  # fmt: skip


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, *, out: torch.Tensor | None = None,
                            num_splits: int | None = None, config: KernelConfig | None = None,
                            counters: torch.Tensor | None = None, pdl: bool = False,
                            row_slots: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """q `[B, Hq, D]` at position `seq_lens[b] - 1` of row b, its own KV already cached. `counters`: zeroed int32,
    >= B * Hkv entries (`attention.split_counters`): the fused merge, zero again after. `config`: `decode_config`."""
    batch, num_heads, _ = q.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    if (row_slots is None and block_tables.shape[0] != batch) or seq_lens.shape != (batch,):
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / seq_lens {tuple(seq_lens.shape)} do not match batch {batch}"
        )
    if num_splits is None:
        num_splits = decode_num_splits(batch, num_kv_heads, block_tables.shape[1], page_size, q.device)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if config is None:
        config = decode_config(num_splits, block_tables.shape[1] * page_size)
    if out is None:
        out = torch.empty_like(q)
    group = num_heads // max(num_kv_heads, 1)
    return launch_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, None, scale, out,
        num_rows=batch, block_q=1, group_pad=max(MIN_DOT_DIM, triton.next_power_of_2(group)),
        num_q_blocks=1, num_splits=num_splits, config=config, counters=counters, pdl=pdl, row_slots=row_slots,
    )  # fmt: skip
