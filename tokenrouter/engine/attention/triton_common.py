"""Host side of the Triton paged-attention kernels: tile configuration, split heuristic, launch. Everything here
depends on shapes, dtypes and arguments only, never on tensor values (graph-capturable)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton

from tokenrouter.engine.attention.triton_kernels import paged_attention_fwd_kernel, split_reduce_kernel

DEFAULT_NUM_SMS = 132  # the H200's, for runs without a CUDA device (interpreter)
MIN_DOT_DIM = 16  # tl.dot needs every dimension >= 16


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch knobs; `block_m`: target (query token x group head) rows of an extend tile."""

    block_n: int = 64
    block_m: int = 64
    num_warps: int = 4
    num_stages: int = 2
    # Fused decode merge: fp32 elements of partial output loaded at once ([group, splits, head_dim] chunk).
    merge_elems: int = 8192


DECODE_CONFIG = KernelConfig(block_n=64, num_warps=4, num_stages=2)
# Decode splits of at most SHORT_SPLIT_TILES key tiles: nothing to pipeline (docs/engine.md, Measured choices).
SHORT_DECODE_CONFIG = KernelConfig(block_n=64, num_warps=2, num_stages=1)
SHORT_SPLIT_TILES = 4
# merge_elems: the fused merge's chunk beside a 64-row tile's live state (8192 spills at group 8 on sm_90).
EXTEND_CONFIG = KernelConfig(block_n=64, block_m=64, num_warps=4, num_stages=2, merge_elems=2048)
# Extend launches with counters merge their splits in the forward kernel while a query block holds at most this many
# tokens: the last arriving program merges them one by one (longer blocks: the reduce kernel's token x head grid).
# 16: a varlen graph's short rows (<= 16 tokens) in one 128-row block at GQA 8 (`extend_config`).
FUSED_EXTEND_MAX_Q = 16
# Extend launches with `split_keys` (dynamic splits, fused merge only) size their grid for at most this many splits.
EXTEND_MAX_DYN_SPLITS = 8


def extend_config(block_m: int = 0) -> KernelConfig:
    """The extend tile config with `block_m` query rows (0: EXTEND_CONFIG's 64). 128-row tiles take 8 warps: with 4
    the fused merge's state spills on sm_90 (255 registers, 440 B), with 8 it fits (205, no spill)."""
    if block_m == 0 or block_m == EXTEND_CONFIG.block_m:
        return EXTEND_CONFIG
    if block_m not in (16, 32, 128):
        raise ValueError(f"extend block_m must be 0, 16, 32, 64 or 128, got {block_m}")
    return replace(EXTEND_CONFIG, block_m=block_m, num_warps=8 if block_m == 128 else EXTEND_CONFIG.num_warps)


@dataclass(frozen=True)
class RopeStore:
    """Decode with the q/k RMSNorm, RoPE and K/V write folded in (`decode_attention_fused_rope`): the launch's q is
    the q part of the raw qkv rows, these are the rest of `triton_ops.qk_norm_rope_store`'s operands."""

    positions: torch.Tensor  # [T] int32/int64
    cos_sin: torch.Tensor  # [max_positions, D] float32
    norm_weight: torch.Tensor | None  # [2, D] q_norm | k_norm rows, contiguous; None: no q/k norm
    eps: float
    slot_mapping: torch.Tensor  # [T] int32/int64 cache slot of each token
    row_tokens: int = 1  # the most tokens of one request in the launch (consecutive rows sharing a row slot)


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


def choose_num_splits(num_programs: int, max_kv_len: int, sm_count: int, *, min_split_tokens: int = 256,
                      max_splits: int = 64, programs_per_sm: int = 4) -> int:  # fmt: skip
    """KV splits for about `programs_per_sm` programs per SM, none finer than `min_split_tokens`; from shapes only
    (the grid without splits, block-table width x page size)."""
    if max_kv_len <= min_split_tokens or num_programs <= 0:
        return 1
    wanted = math.ceil(programs_per_sm * sm_count / num_programs)
    useful = math.ceil(max_kv_len / min_split_tokens)
    return max(1, min(wanted, useful, max_splits))


def can_fuse_merge(counters: torch.Tensor | None, programs: int, is_decode: bool, block_q: int) -> bool:
    """Whether a split launch of `programs` (row, KV head, query block) triples merges in the forward kernel."""
    return (counters is not None and counters.numel() >= programs and counters.dtype == torch.int32
            and (is_decode or block_q <= FUSED_EXTEND_MAX_Q))  # fmt: skip


def decode_config(num_splits: int, max_kv_len: int) -> KernelConfig:
    """The decode tile config for rows of up to `max_kv_len` keys in `num_splits` splits."""
    tiles = math.ceil(max_kv_len / num_splits / DECODE_CONFIG.block_n)
    return SHORT_DECODE_CONFIG if tiles <= SHORT_SPLIT_TILES else DECODE_CONFIG


def block_d(head_dim: int) -> int:
    return max(MIN_DOT_DIM, triton.next_power_of_2(head_dim))


def fwd_constexprs(*, group: int, group_pad: int, block_q: int, block_n: int, head_dim: int, page_size: int,
                   is_decode: bool, single_split: bool, dtype: torch.dtype, fused_reduce: bool = False,
                   merge_chunk: int = 1, use_pdl: bool = False, has_slots: bool = False,
                   dyn_splits: bool = False, rows_p2: int = 1, fused_rope: bool = False, has_norm: bool = False,
                   row_tokens: int = 1, num_warps: int = 1) -> dict[str, int | bool | str]:  # fmt: skip
    """Compile-time parameters of `paged_attention_fwd_kernel`, shared by launches and `aot_check`. Without
    `fused_rope` the RoPE constexprs keep fixed values (`has_norm`, `row_tokens`, `num_warps` ignored), so the
    unfused variants are the same for every model."""
    if not fused_rope:
        has_norm, row_tokens, num_warps = False, 1, 1
    # fp32 caches (CPU tests, debugging) get exact fp32 products instead of TF32 (DOT_PRECISION); bf16 ignores it.
    return {"GROUP": group, "GROUP_PAD": group_pad, "BLOCK_Q": block_q, "BLOCK_M": block_q * group_pad,
            "BLOCK_N": max(MIN_DOT_DIM, block_n), "HEAD_DIM": head_dim, "BLOCK_D": block_d(head_dim),
            "PAGE_SIZE": page_size, "IS_DECODE": is_decode, "SINGLE_SPLIT": single_split,
            "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32", "FUSED_REDUCE": fused_reduce,
            "GROUP_P2": triton.next_power_of_2(group), "MERGE_CHUNK": merge_chunk, "USE_PDL": use_pdl,
            "HAS_SLOTS": has_slots, "DYN_SPLITS": dyn_splits, "ROWS_P2": rows_p2, "FUSED_ROPE": fused_rope,
            "HAS_NORM": has_norm, "ROW_TOKENS": row_tokens, "ROW_TOKENS_P2": triton.next_power_of_2(row_tokens),
            "NORM_ROWS": num_warps}  # fmt: skip


def merge_chunk(num_splits: int, group: int, head_dim: int, config: KernelConfig) -> int:
    """Splits per load of the fused decode merge: a power of two, a [group, chunk, head_dim] fp32 tile of about
    `config.merge_elems`."""
    per_split = triton.next_power_of_2(group) * block_d(head_dim)
    return max(1, min(triton.next_power_of_2(num_splits), config.merge_elems // per_split))


def reduce_constexprs(num_splits: int, head_dim: int, use_pdl: bool = False) -> dict[str, int | bool]:
    return {"SPLITS_PAD": triton.next_power_of_2(num_splits), "HEAD_DIM": head_dim, "BLOCK_D": block_d(head_dim),
            "USE_PDL": use_pdl}  # fmt: skip


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected q [T, Hq, D] and caches [P, page, Hkv, D], got {q.shape}, {k_cache.shape}")
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not fit cache {tuple(k_cache.shape)} (D equal, Hq % Hkv == 0)")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q and caches must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous (stride 1) dimension of q and the caches")
    page_size = k_cache.shape[1]
    if page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two, got {page_size}")
    if block_tables.dtype not in (torch.int32, torch.int64) or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be an int32/int64 tensor with contiguous rows")


def launch_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor | None, scale: float, out: torch.Tensor,
                           *, num_rows: int, block_q: int, group_pad: int, num_q_blocks: int, num_splits: int,
                           config: KernelConfig, counters: torch.Tensor | None = None, pdl: bool = False,
                           row_slots: torch.Tensor | None = None, split_keys: int = 0,
                           split_programs: int = 0, rope: RopeStore | None = None) -> torch.Tensor:  # fmt: skip
    """Launch the forward kernel (and the reduce when `num_splits > 1`); `cu_seqlens_q is None` = decode. `counters`
    (>= rows x Hkv x query blocks entries, else ignored; extend: query blocks of at most FUSED_EXTEND_MAX_Q tokens):
    the forward kernel merges the splits itself, no reduce launch. `split_keys` > 0 (with that fused merge only):
    each query block uses one split per `split_keys` keys it sees, at most `num_splits` (`DYN_SPLITS`), and with
    `split_programs` > 0 at most about that many programs in all (counted on the device from the busy rows).
    `rope` (decode): q is a view of the raw qkv rows, normed, rotated and stored with its K/V in the kernel."""
    _check_inputs(q, k_cache, v_cache, block_tables)
    if out.shape != q.shape or out.stride(2) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with a contiguous last dim")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_rows == 0 or num_tokens == 0:
        return out
    single = num_splits == 1
    if single:
        # Never read: the SINGLE_SPLIT branch writes `out` directly. Any tensor serves as a placeholder.
        mid_o, mid_lse = out, out
        m_strides, l_strides = (0, 0, 0), (0, 0)
    else:
        mid_o = torch.empty((num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
        m_strides, l_strides = mid_o.stride()[:3], mid_lse.stride()[:2]
    is_decode = cu_seqlens_q is None
    group = num_heads // num_kv_heads
    fused = not single and can_fuse_merge(counters, num_rows * num_kv_heads * num_q_blocks, is_decode, block_q)
    meta = fwd_constexprs(
        group=group, group_pad=group_pad, block_q=block_q, block_n=config.block_n,
        head_dim=head_dim, page_size=k_cache.shape[1], is_decode=is_decode, single_split=single, dtype=q.dtype,
        fused_reduce=fused, merge_chunk=merge_chunk(num_splits, group, head_dim, config) if fused else 1,
        use_pdl=pdl, has_slots=row_slots is not None, dyn_splits=(dyn := fused and split_keys > 0),
        rows_p2=triton.next_power_of_2(num_rows) if dyn and split_programs > 0 else 1,
        fused_rope=rope is not None, has_norm=rope is not None and rope.norm_weight is not None,
        row_tokens=rope.row_tokens if rope is not None else 1, num_warps=config.num_warps,
    )  # fmt: skip
    # Placeholders where there is no RoPE to fuse (never read).
    r_ptrs, r_eps, r_stride = (seq_lens,) * 4, 0.0, 0
    if rope is not None:
        nw = q if rope.norm_weight is None else rope.norm_weight
        r_ptrs = (rope.positions, rope.cos_sin, nw, rope.slot_mapping)
        r_eps, r_stride = rope.eps, rope.cos_sin.stride(0)
    grid = (num_rows, num_kv_heads * num_q_blocks, num_splits)
    launch = {"num_warps": config.num_warps, "num_stages": config.num_stages, **({"launch_pdl": True} if pdl else {})}
    paged_attention_fwd_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, seq_lens if is_decode else cu_seqlens_q, out, mid_o, mid_lse,
        counters if fused else seq_lens, row_slots if row_slots is not None else seq_lens, *r_ptrs,
        scale * math.log2(math.e), num_splits, num_q_blocks, max(split_keys, 1), split_programs if dyn else 0, r_eps,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), *m_strides, *l_strides, r_stride,
        **meta, **launch,
    )  # fmt: skip
    if not single and not fused:
        # Extend: the reduce writes only the tokens of this launch's rows (`cu_seqlens_q`), never other tokens of
        # `out` (the varlen graphs launch two row groups into one output).
        cu, cu_rows = (seq_lens, 0) if is_decode else (cu_seqlens_q, num_rows)
        split_reduce_kernel[(num_tokens, num_heads)](
            mid_o, mid_lse, out, cu, num_splits, cu_rows, *m_strides, *l_strides, out.stride(0), out.stride(1),
            **reduce_constexprs(num_splits, head_dim, pdl), num_warps=4 if head_dim >= 128 else 2,
            **({"launch_pdl": True} if pdl else {}),
        )  # fmt: skip
    return out
