"""Paged attention: KV store (layout: `kv_store`), decode and extend, a torch oracle and Triton kernels (imported
lazily; `python -m tokenrouter.engine.aot_check` compiles them for sm_90 without a GPU). Backends: "torch" (runs
anywhere, not graph-capturable), "triton" (GPU, or TRITON_INTERPRET=1 set before import), "auto" (see
`resolve_backend`)."""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

from tokenrouter.engine.attention.kv_store import store_kv
from tokenrouter.engine.attention.reference import decode_attention_torch, extend_attention_torch

Backend = Literal["auto", "torch", "triton"]

__all__ = ["Backend", "decode_attention", "decode_attention_fused_rope", "extend_attention", "fused_rope_applies",
           "resolve_backend", "split_counters", "store_kv"]  # fmt: skip


def split_counters(num_rows: int, num_kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """Zeroed arrival counters for the fused split-KV decode merge of up to `num_rows` rows; share only between
    launches of one stream (the kernel leaves them zero)."""
    return torch.zeros(num_rows * num_kv_heads, dtype=torch.int32, device=device)


def resolve_backend(backend: Backend, device: torch.device) -> Literal["torch", "triton"]:
    """Map "auto" to triton for CUDA tensors or under TRITON_INTERPRET=1, else torch."""
    if backend in ("torch", "triton"):
        return backend
    if backend != "auto":
        raise ValueError(f"unknown attention backend {backend!r}; expected 'auto', 'torch' or 'triton'")
    if importlib.util.find_spec("triton") is None:
        return "torch"
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "triton"
    return "torch"


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, *, out: torch.Tensor | None = None,
                     num_splits: int | None = None, backend: Backend = "auto", counters: torch.Tensor | None = None,
                     pdl: bool = False, row_slots: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """One new query per row: q `[B, Hq, D]`, seq_lens `[B]` int32 = KV length including it (its KV stored);
    returns `[B, Hq, D]` (into `out`). Query head h reads KV head h // (Hq // Hkv). `row_slots` ([B] int32): row b
    reads `block_tables[row_slots[b]]`. Triton only: `num_splits`, `counters` (`split_counters`), `pdl`."""
    if resolve_backend(backend, q.device) == "torch":
        bt = block_tables if row_slots is None else block_tables.index_select(0, row_slots.long())
        return decode_attention_torch(q, k_cache, v_cache, bt, seq_lens, scale, out=out)
    from tokenrouter.engine.attention.triton_decode import decode_attention_triton

    return decode_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, scale, out=out, num_splits=num_splits, counters=counters,
        pdl=pdl, row_slots=row_slots,
    )  # fmt: skip


def fused_rope_applies(backend: Backend, device: torch.device, head_dim: int) -> bool:
    """Whether `decode_attention_fused_rope` serves this backend and head_dim (Triton; a power-of-two head_dim >= 16,
    as `triton_decode.fused_rope_supported`, without importing Triton)."""
    return resolve_backend(backend, device) == "triton" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def decode_attention_fused_rope(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                                norm_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor,
                                v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                                seq_lens: torch.Tensor, scale: float, *, num_heads: int,
                                out: torch.Tensor | None = None, num_splits: int | None = None,
                                counters: torch.Tensor | None = None, pdl: bool = False,
                                row_slots: torch.Tensor | None = None,
                                max_row_tokens: int = 1) -> torch.Tensor:  # fmt: skip
    """`triton_ops.qk_norm_rope_store(qkv, positions, cos_sin, norm_weight, eps, k_cache, v_cache, slot_mapping, ...)`
    then `decode_attention` on its q, in one Triton launch with the same bits (`EngineConfig.decode_fused_rope`).
    `max_row_tokens`: with `row_slots`, the most tokens of one request in this launch, laid out as consecutive rows
    sharing a row slot at consecutive positions (a graph step's rows of several tokens). Triton only
    (`fused_rope_applies`)."""
    from tokenrouter.engine.attention.triton_common import RopeStore
    from tokenrouter.engine.attention.triton_decode import decode_attention_fused_rope_triton

    rope = RopeStore(positions, cos_sin, norm_weight, eps, slot_mapping, max_row_tokens)
    return decode_attention_fused_rope_triton(
        qkv, rope, k_cache, v_cache, block_tables, seq_lens, scale, num_heads, out=out, num_splits=num_splits,
        counters=counters, pdl=pdl, row_slots=row_slots,
    )  # fmt: skip


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, scale: float, *, max_q_len: int | None = None,
                     out: torch.Tensor | None = None, num_splits: int | None = None, backend: Backend = "auto",
                     pdl: bool = False, row_slots: torch.Tensor | None = None,
                     counters: torch.Tensor | None = None, split_keys: int = 0, split_programs: int = 0,
                     block_m: int = 0) -> torch.Tensor:  # fmt: skip
    """Causal attention for packed new tokens q `[T, Hq, D]` of B rows: row b owns tokens `cu_seqlens_q[b]:[b+1]`,
    seq_lens `[B]` its KV length (new KV stored); query i sits at `seq_lens[b] - q_len_b + i`. `max_q_len` (bound
    on q_len_b) avoids a host sync. Tokens outside every row are left untouched in `out`. `row_slots`, `counters`:
    as in decode; Triton only: `split_keys` and `split_programs` (splits from each row's context and the busy rows,
    on the device, `extend_attention_triton`) and `block_m` (query rows of a tile, `triton_common.extend_config`;
    0: the default).
    """
    if resolve_backend(backend, q.device) == "torch":
        bt = block_tables if row_slots is None else block_tables.index_select(0, row_slots.long())
        return extend_attention_torch(q, k_cache, v_cache, bt, cu_seqlens_q, seq_lens, scale, out=out)
    from tokenrouter.engine.attention.triton_common import extend_config
    from tokenrouter.engine.attention.triton_extend import extend_attention_triton

    return extend_attention_triton(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
        max_q_len=max_q_len, out=out, num_splits=num_splits, pdl=pdl, row_slots=row_slots, counters=counters,
        split_keys=split_keys, split_programs=split_programs, config=extend_config(block_m),
    )  # fmt: skip
