"""Shared paged-attention test data: a dense float64 ground truth scattered into a shuffled, NaN-poisoned paged
cache, and a naive float64 oracle. Used by test_attention.py and by the interpreter cases it runs in a child
process (interp_attention.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.engine.attention import store_kv


@dataclass
class PagedCase:
    """Per-row dense ground truth plus the same data scattered into a shuffled paged cache."""

    keys: list[torch.Tensor]  # [L_b, Hkv, D] float64
    values: list[torch.Tensor]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32, unused entries = 0 (the poisoned null page)
    seq_lens: torch.Tensor  # int32


def make_case(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, page_size: int, *, seed: int, extra_cols: int = 2
) -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen, dtype=torch.float64) for n in seq_lens]
    values = [torch.randn(n, num_kv_heads, head_dim, generator=gen, dtype=torch.float64) for n in seq_lens]
    pages_per_row = [-(-n // page_size) for n in seq_lens]
    num_pages = 1 + sum(pages_per_row) + 3  # page 0 is null; a few pages stay unused
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    # Shuffled, non-contiguous page assignment: rows interleave across the pool.
    free = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    block_tables = torch.zeros(len(seq_lens), max(pages_per_row, default=0) + extra_cols, dtype=torch.int32)
    for b, n_pages in enumerate(pages_per_row):
        block_tables[b, :n_pages] = torch.tensor([free.pop() for _ in range(n_pages)], dtype=torch.int32)
    # Write through store_kv, as the model does.
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        slots = block_tables[b, pos // page_size].long() * page_size + pos % page_size
        store_kv(keys[b].float(), values[b].float(), k_cache, v_cache, slots)
    return PagedCase(keys, values, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32))


def oracle(q: torch.Tensor, case: PagedCase, q_lens: list[int], scale: float) -> torch.Tensor:
    """Naive float64 attention from the dense per-row tensors, one (token, head) at a time."""
    num_heads, num_kv_heads = q.shape[1], case.keys[0].shape[1] if case.keys else 1
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    t = 0
    for b, q_len in enumerate(q_lens):
        seq_len = int(case.seq_lens[b])
        for i in range(q_len):
            pos = seq_len - q_len + i
            for h in range(num_heads):
                k = case.keys[b][: pos + 1, h // group]
                v = case.values[b][: pos + 1, h // group]
                w = torch.softmax((k @ q[t + i, h].double()) * scale, dim=0)
                out[t + i, h] = w @ v
        t += q_len
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12)).item()


def cu_seqlens(q_lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)


def nan_like(q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, float("nan"))
