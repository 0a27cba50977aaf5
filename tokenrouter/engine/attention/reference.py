"""Pure-torch paged attention: the oracle for the Triton kernels and the CPU path. A float32 (float64 for float64
inputs) masked softmax over gathered pages; reads `seq_lens` on the host (not graph-capturable)."""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Dense `[seq_len, Hkv, D]` view of one request's tokens from a `[P, page_size, Hkv, D]` cache."""
    page_size = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    pages = block_table_row.to(device=cache.device, dtype=torch.int64)[pos // page_size]
    return cache[pages, pos % page_size]


def extend_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                           out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Causal attention of packed queries `[T, Hq, D]` over paged KV (the contract of `extend_attention`); a row
    with `seq_lens[b] == 0` outputs zeros, as the Triton kernels do."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"Hq={num_heads} is not a multiple of Hkv={num_kv_heads}")
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        if q_len > seq_len:
            if seq_len == 0:
                out[q0:q1] = 0
                continue
            raise ValueError(f"row {b}: {q_len} queries but only {seq_len} KV tokens")
        # GQA: query head h reads KV head h // group, so repeat each KV head `group` times in order.
        k = gather_kv(k_cache, block_tables[b], seq_len).to(cdt).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, block_tables[b], seq_len).to(cdt).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[q0:q1].to(cdt), k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
    return out


def decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, *,
                           out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Decode is extend with one query per row, sitting at position `seq_lens[b] - 1`."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return extend_attention_torch(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, out=out)
