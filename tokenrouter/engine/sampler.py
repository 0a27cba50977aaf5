"""Vectorized sampling: greedy, temperature, top-k, top-p, seeded per request.

Sampling is Gumbel-max: token = argmax(logits / T + g) over the allowed tokens, with g = -log(-log u) and u
from a counter-based hash of (seed, position, token id). So a draw depends only on the request's seed, the
position being sampled and the logits: it is reproducible across batch compositions, engines and graph
replays, needs no generator state on the device, and contains no host sync (it could live inside a graph).
Requests without a seed get one from the engine's own host RNG when the batch is prepared.

The hash uses only int64 ops whose intermediates stay below 2^63 (32-bit multiplies are split into 16-bit
halves), so CPU and CUDA give bit-identical noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenrouter.core.request import SamplingParams

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x < 2^32, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 finalizer: a bijective avalanche mix of 32-bit values held in int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def seed32(seed: int) -> int:
    """Fold an arbitrary Python int seed into 32 bits."""
    s = seed & 0xFFFFFFFFFFFFFFFF
    return (s ^ (s >> 32)) & _M32


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [R, V] (float32), a pure function of (seeds[r], positions[r], token id)."""
    key = _fmix32(seeds ^ _fmix32(_mul32(positions & _M32, 0x9E3779B1) ^ 0x5BD1E995))  # [R]
    tok = _fmix32(torch.arange(vocab_size, device=seeds.device, dtype=torch.int64) ^ 0x27D4EB2F)  # [V]
    h = _fmix32(key[:, None] ^ tok[None, :])
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # uniform in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


@dataclass(slots=True)
class SamplingInputs:
    """Per-row sampling parameters of one step, as device tensors (built from host values, no sync)."""

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_p: torch.Tensor  # [R] float32
    top_k: torch.Tensor  # [R] int64, vocab_size when off
    seeds: torch.Tensor  # [R] int64 in [0, 2^32)
    positions: torch.Tensor  # [R] int64: position of the token being sampled
    all_greedy: bool
    needs_filter: bool  # some row uses top-k or top-p

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        positions: list[int],
        vocab_size: int,
        fallback_seeds: list[int],
        device: torch.device,
    ) -> SamplingInputs:
        """`fallback_seeds[i]` is used when row i's request has no seed (drawn from the engine's RNG)."""
        n = len(params)
        temp = np.fromiter((p.temperature for p in params), np.float32, n)
        top_p = np.fromiter((p.top_p for p in params), np.float32, n)
        top_k = np.fromiter((vocab_size if p.top_k < 0 else min(p.top_k, vocab_size) for p in params), np.int64, n)
        seeds = np.fromiter(
            (seed32(p.seed) if p.seed is not None else f for p, f in zip(params, fallback_seeds, strict=True)),
            np.int64,
            n,
        )
        sampled = temp > 0
        needs_filter = bool(np.any(sampled & ((top_p < 1.0) | (top_k < vocab_size))))
        ints = torch.from_numpy(np.stack([top_k, seeds, np.asarray(positions, np.int64)]))
        floats = torch.from_numpy(np.stack([temp, top_p]))
        non_blocking = device.type == "cuda"
        if non_blocking:
            ints, floats = ints.pin_memory(), floats.pin_memory()
        ints = ints.to(device, non_blocking=non_blocking)
        floats = floats.to(device, non_blocking=non_blocking)
        return cls(floats[0], floats[1], ints[0], ints[1], ints[2], not bool(sampled.any()), needs_filter)


def sample(logits: torch.Tensor, s: SamplingInputs) -> torch.Tensor:
    """Next token per row [R] int64 from logits [R, V]; greedy rows take the argmax of the raw logits."""
    greedy_tok = logits.argmax(dim=-1)
    if s.all_greedy:
        return greedy_tok
    logits = logits.float()
    temp = torch.where(s.temperature > 0, s.temperature, torch.ones_like(s.temperature))
    x = logits / temp[:, None]
    if s.needs_filter:
        x = _apply_top_k_top_p(x, s.top_k, s.top_p)
    tok = (x + gumbel_noise(s.seeds, s.positions, x.shape[-1])).argmax(dim=-1)
    return torch.where(s.temperature > 0, tok, greedy_tok)


def _apply_top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and outside the smallest set with mass >= top_p."""
    sorted_x, order = x.sort(dim=-1, descending=True)
    ranks = torch.arange(x.shape[-1], device=x.device)
    remove = ranks[None, :] >= top_k[:, None]
    probs = sorted_x.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly higher-ranked tokens
    # Rank 0 is never removed (mass_before = 0 < top_p); rows with top_p == 1 skip the test (rounding).
    remove |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_x = sorted_x.masked_fill(remove, float("-inf"))
    return torch.empty_like(x).scatter_(-1, order, sorted_x)
