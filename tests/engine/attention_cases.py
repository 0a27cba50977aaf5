"""Shared paged-attention test data: a dense float64 ground truth scattered into a shuffled, NaN-poisoned paged
cache, and a naive float64 oracle. Used by test_attention.py and by the interpreter cases it runs in a child
process (interp_attention.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.engine.attention import store_kv
from tokenrouter.engine.attention.reference import decode_attention_torch


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


@dataclass
class RopeStep:
    """A decode step as a graph lays it out (`part_writer`): each request's new tokens as consecutive virtual rows
    sharing its row slot, positions rising by one, seq_len = position + 1; padding rows at row slot 0 (the null
    page table), position 0, slot 0. The raw qkv rows of every token, the context before each request's first new
    position cached, every other cache entry NaN (the new tokens' slots included)."""

    qkv: torch.Tensor  # [T, (Hq + 2 Hkv) * D]
    positions: torch.Tensor  # [T] int32
    slot_mapping: torch.Tensor  # [T] int32
    row_slots: torch.Tensor  # [T] int32
    seq_lens: torch.Tensor  # [T] int32
    block_tables: torch.Tensor  # [slots, W] int32; row 0 all zeros (the null page)
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cos_sin: torch.Tensor  # float32 [max_positions, D]
    norm_weight: torch.Tensor | None  # [2, D] q_norm | k_norm, or None
    num_heads: int

    def to(self, device: torch.device) -> RopeStep:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return RopeStep(**moved)


def rope_step(requests: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
              dtype: torch.dtype, qk_norm: bool, seed: int, padding: int = 1,
              extra_cols: int = 2) -> RopeStep:  # fmt: skip
    """`requests`: (first new position, new tokens) of each request (row slots 1, 2, ... in order), then `padding`
    padding rows (all the same qkv row, as a graph's padding tokens are)."""
    from tokenrouter.engine.layers import RotaryEmbedding

    gen = torch.Generator().manual_seed(seed)
    ends = [first + n for first, n in requests]
    pages = [-(-e // page_size) for e in ends]
    num_pages = 1 + sum(pages) + 2
    free = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(requests) + 1, max(pages) + extra_cols, dtype=torch.int32)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    pos, rs = [], []
    for s, ((first, n), n_pages) in enumerate(zip(requests, pages, strict=True), start=1):
        tables[s, :n_pages] = torch.tensor([free.pop() for _ in range(n_pages)], dtype=torch.int32)
        for p in range(first):
            page, off = int(tables[s, p // page_size]), p % page_size
            k_cache[page, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
            v_cache[page, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
        pos += range(first, first + n)
        rs += [s] * n
    real = len(pos)
    pos += [0] * padding
    rs += [0] * padding
    qkv = torch.randn(len(pos), (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    if padding:
        qkv[real:] = qkv[real]
    slots = [int(tables[s, p // page_size]) * page_size + p % page_size for s, p in zip(rs, pos, strict=True)]
    norm_weight = (1 + 0.2 * torch.randn(2, head_dim, generator=gen)).to(dtype) if qk_norm else None
    i32 = torch.int32
    return RopeStep(qkv, torch.tensor(pos, dtype=i32), torch.tensor(slots, dtype=i32), torch.tensor(rs, dtype=i32),
                    torch.tensor(pos, dtype=i32) + 1, tables, k_cache, v_cache,
                    RotaryEmbedding(head_dim, 1e6, max(ends) + 1, device=torch.device("cpu")).cos_sin, norm_weight,
                    num_heads)  # fmt: skip


def bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN == NaN where the payload matches)."""
    return x.view({2: torch.int16, 4: torch.int32}[x.element_size()])


def fused_rope_vs_unfused(step: RopeStep, *, max_row_tokens: int, row_slots: bool = True, **launch) -> list[str]:
    """`qk_norm_rope_store` + `decode_attention_triton` against `decode_attention_fused_rope_triton` on copies of
    the step's caches (`launch`: num_splits, config, counters, pdl): the names of what differs in any bit (output, K
    cache, V cache); [] when bit-identical. The unfused output is first checked against the torch reference on the
    same q and caches (so that two equal outputs are never two equal wrong ones)."""
    from tokenrouter.engine import triton_ops
    from tokenrouter.engine.attention.triton_common import RopeStore
    from tokenrouter.engine.attention.triton_decode import decode_attention_fused_rope_triton, decode_attention_triton

    s = step
    slots = s.row_slots if row_slots else None
    tables = s.block_tables if row_slots else s.block_tables.index_select(0, s.row_slots.long())
    hkv, d = s.k_cache.shape[2], s.k_cache.shape[3]
    kr, vr = s.k_cache.clone(), s.v_cache.clone()
    q = triton_ops.qk_norm_rope_store(s.qkv, s.positions, s.cos_sin, s.norm_weight, 1e-6, kr, vr, s.slot_mapping,
                                      s.num_heads, hkv, d)  # fmt: skip
    ref = decode_attention_triton(q, kr, vr, tables, s.seq_lens, d**-0.5, row_slots=slots, **launch)
    dense = s.block_tables.index_select(0, s.row_slots.long())
    torch_ref = decode_attention_torch(q.float(), kr.float(), vr.float(), dense, s.seq_lens, d**-0.5)
    assert rel_err(ref, torch_ref) < (1e-4 if q.dtype == torch.float32 else 2e-2), rel_err(ref, torch_ref)
    kf, vf = s.k_cache.clone(), s.v_cache.clone()
    rope = RopeStore(s.positions, s.cos_sin, s.norm_weight, 1e-6, s.slot_mapping, max_row_tokens)
    out = decode_attention_fused_rope_triton(s.qkv, rope, kf, vf, tables, s.seq_lens, d**-0.5, s.num_heads,
                                             row_slots=slots, **launch)  # fmt: skip
    pairs = {"out": (out, ref), "k_cache": (kf, kr), "v_cache": (vf, vr)}
    return [name for name, (a, b) in pairs.items() if not torch.equal(bits(a), bits(b))]
