"""Sampling: greedy, temperature, top-k, top-p, seeded per request: the definition (docs/engine.md, Sampling and
log-probabilities) and torch reference of the in-graph kernel. The hash keeps every int64 intermediate below 2^63,
so CPU, CUDA and the kernel's uint32 arithmetic give bit-identical noise."""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
MAX_LOGPROBS = 20  # most top log-probabilities a row may ask for (OpenAI's top_logprobs limit)
# Words per logit row of the step output's log-probability region: the sampled token's value, MAX_LOGPROBS ids,
# their values (floats as int32 bits).
LOGPROB_WORDS = 1 + 2 * MAX_LOGPROBS


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


def no_nan(logits: torch.Tensor) -> torch.Tensor:
    """`logits` with NaN replaced by -inf (infinities kept): what every sampling reduction reads."""
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def sample_rows(logits: torch.Tensor, inv_temp: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The reference: int32 [R] tokens. Seeds may be given as int32 bit patterns (negative values)."""
    vocab = logits.shape[-1]
    logits = no_nan(logits)
    greedy = logits.argmax(dim=-1)
    x = logits.float() * inv_temp.float()[:, None]
    thr = filter_thresholds(x, top_k.long(), top_p.float())
    noise = gumbel_noise(seeds.long() & _M32, positions.long(), vocab)
    score = torch.where(x >= thr[:, None], x + noise, torch.full_like(x, float("-inf")))
    tok = score.argmax(dim=-1)
    return torch.where(inv_temp > 0, tok, greedy).to(torch.int32)


def filter_thresholds(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row the smallest allowed x: max(t_k, t_p), -inf where neither filter applies."""
    rows, vocab = x.shape
    sorted_x = x.sort(dim=-1, descending=True).values
    neg_inf = torch.full((rows,), float("-inf"), device=x.device)
    use_k = (top_k > 0) & (top_k < vocab)
    t_k = torch.where(use_k, sorted_x.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])[:, 0], neg_inf)
    e = torch.exp(sorted_x - sorted_x[:, :1])
    total = e.sum(dim=-1)
    # mass of the tokens at or above sorted_x[j] (ties included): the cumsum at the last equal value
    last = torch.searchsorted(-sorted_x.contiguous(), -sorted_x.contiguous(), right=True) - 1
    mass_ge = e.cumsum(dim=-1).gather(1, last)
    ok = mass_ge >= (top_p * total)[:, None]
    first = ok.int().argmax(dim=-1)
    use_p = (top_p < 1.0) & ok.any(dim=-1)
    t_p = torch.where(use_p, sorted_x.gather(1, first[:, None])[:, 0], neg_inf)
    return torch.maximum(t_k, t_p)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """The reference (fp32): (logprob of `tokens` [R], top ids [R, k] int64, top values [R, k]) of logits [R, V]."""
    lp = torch.log_softmax(no_nan(logits.float()), dim=-1)
    tok = lp.gather(1, tokens.long().view(-1, 1))[:, 0]
    k = min(k, lp.shape[-1])
    vals, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    return tok, ids[:, :k], vals[:, :k]
