"""Split-KV ("flash-decoding") paged decode attention in Triton: grid (B, Hkv, num_splits), splits merged by
log-sum-exp in-kernel (arrival `counters`) or in a reduce kernel; no host reads (docs/engine.md, Kernels)."""

from __future__ import annotations

import torch
import triton

from tokenrouter.engine.attention.triton_common import (
    MIN_DOT_DIM,
    KernelConfig,
    RopeStore,
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
                            row_slots: torch.Tensor | None = None,
                            rope: RopeStore | None = None) -> torch.Tensor:  # fmt: skip
    """q `[B, Hq, D]` at position `seq_lens[b] - 1` of row b, its own KV already cached. `counters`: zeroed int32,
    >= B * Hkv entries (`attention.split_counters`): the fused merge, zero again after. `config`: `decode_config`.
    `rope`: q is the raw q part of the qkv rows, its KV not yet cached (`decode_attention_fused_rope_triton`)."""
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
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    group = num_heads // max(num_kv_heads, 1)
    return launch_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, None, scale, out,
        num_rows=batch, block_q=1, group_pad=max(MIN_DOT_DIM, triton.next_power_of_2(group)),
        num_q_blocks=1, num_splits=num_splits, config=config, counters=counters, pdl=pdl, row_slots=row_slots,
        rope=rope,
    )  # fmt: skip


def fused_rope_supported(head_dim: int) -> bool:
    """Whether `decode_attention_fused_rope_triton` takes this head_dim: a power of two of at least MIN_DOT_DIM (its
    RoPE halves are unpadded power-of-two tiles)."""
    return head_dim >= MIN_DOT_DIM and head_dim & (head_dim - 1) == 0


def decode_attention_fused_rope_triton(
    qkv: torch.Tensor, rope: RopeStore, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, num_heads: int, *, out: torch.Tensor | None = None,
    num_splits: int | None = None, config: KernelConfig | None = None, counters: torch.Tensor | None = None,
    pdl: bool = False, row_slots: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """`triton_ops.qk_norm_rope_store` + `decode_attention_triton` in one launch, bit-identical to them: from the
    fused qkv rows `[B, (Hq + 2 Hkv) * D]` (one token a row, at `rope.positions`), each program norms and rotates
    its q heads and writes the new K/V its key range holds (`triton_kernels._store_step_kv`); every row's K/V is
    cached on return. With `row_slots`, consecutive rows sharing a slot at consecutive positions are one request's
    tokens of this step (at most `rope.row_tokens`); without, every row is its own request. Needs seq_lens >= 1.
    `out` serves as the programs' q scratch before it receives the output."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    t = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be [T, {(num_heads + 2 * num_kv_heads) * head_dim}] with contiguous rows, got "
                         f"{tuple(qkv.shape)}")  # fmt: skip
    if not fused_rope_supported(head_dim):
        raise ValueError(f"fused RoPE needs a power-of-two head_dim >= {MIN_DOT_DIM}, got {head_dim}")
    if rope.positions.shape != (t,) or rope.slot_mapping.shape != (t,):
        raise ValueError(f"positions and slot_mapping must be [{t}]")
    cs = rope.cos_sin
    if cs.dtype != torch.float32 or cs.dim() != 2 or cs.shape[1] != head_dim or cs.stride(1) != 1:
        raise ValueError(f"cos_sin must be float32 [positions, {head_dim}] with contiguous rows")
    nw = rope.norm_weight
    if nw is not None and (nw.shape != (2, head_dim) or not nw.is_contiguous()):
        raise ValueError(f"norm_weight must be a contiguous [2, {head_dim}] (q_norm; k_norm)")
    if rope.row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1, got {rope.row_tokens}")
    q = qkv[:, : num_heads * head_dim].view(t, num_heads, head_dim)
    return decode_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, scale, out=out, num_splits=num_splits, config=config,
        counters=counters, pdl=pdl, row_slots=row_slots, rope=rope,
    )  # fmt: skip
