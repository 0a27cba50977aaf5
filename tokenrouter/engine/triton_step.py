"""Triton kernels at the two ends of a step, inside the CUDA graph: `step_prologue` (page-table writes, from_prev
tokens) and `sample` (definitions and torch reference: `sampler`; docs/engine.md, Kernels). NaN logits count as -inf
in every reduction. Import only where kernels run (CUDA, or TRITON_INTERPRET=1)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tokenrouter.engine.sampler import LOGPROB_WORDS, MAX_LOGPROBS
from tokenrouter.engine.triton_ops import pdl_kwargs


@triton.jit
def _prologue_kernel(Table, UpdIdx, UpdVal, Ids, Prev, SlotTok, n_upd, n_tok, BLOCK: tl.constexpr,
                     USE_PDL: tl.constexpr):  # fmt: skip
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    um = i < n_upd
    idx = tl.load(UpdIdx + i, mask=um, other=0).to(tl.int64)
    val = tl.load(UpdVal + i, mask=um, other=0)
    tl.store(Table + idx, val, mask=um)
    tm = i < n_tok
    pv = tl.load(Prev + i, mask=tm, other=-1)
    take = tm & (pv >= 0)
    tok = tl.load(SlotTok + tl.where(take, pv, 0), mask=take, other=0)
    tl.store(Ids + i, tok, mask=take)


def step_prologue(table: torch.Tensor, upd_idx: torch.Tensor, upd_val: torch.Tensor, input_ids: torch.Tensor,
                  prev: torch.Tensor, slot_tokens: torch.Tensor, *, pdl: bool = False) -> None:  # fmt: skip
    n = max(upd_idx.numel(), input_ids.numel())
    if n == 0:
        return
    block = 256
    _prologue_kernel[(triton.cdiv(n, block),)](
        table, upd_idx, upd_val, input_ids, prev, slot_tokens, upd_idx.numel(), input_ids.numel(),
        BLOCK=block, USE_PDL=pdl, num_warps=4, **pdl_kwargs(pdl),
    )  # fmt: skip


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _key(x):
    """Order-preserving uint32 key of fp32 values (larger value, larger key)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _no_nan(x):
    """NaN -> -inf (see the module doc: a NaN must never reach an argmax)."""
    return tl.where(x == x, x, float("-inf"))


@triton.jit
def _radix_select(row, V, inv, m, frac, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Key of the largest x-value v with W(x >= v) >= target, W = count (target `frac`) or mass exp(x - m)
    (target `frac` * total mass). Returns 0 (no cut) when the total falls short of the target."""
    bins = tl.arange(0, 16)
    prefix = tl.zeros([], tl.uint32)
    above = tl.zeros([], tl.float32)
    target = frac
    found = True
    for step in tl.static_range(8):
        shift = 28 - 4 * step  # a constexpr per unrolled step (an annotated constexpr cannot be reassigned)
        w16 = tl.zeros([16], tl.float32)
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            valid = offs < V
            x = _no_nan(tl.load(row + offs, mask=valid, other=0.0).to(tl.float32) * inv)
            key = _key(x)
            inr = valid
            if step > 0:
                inr = inr & ((key >> (shift + 4)) == (prefix >> (shift + 4)))
            nib = ((key >> shift) & 15).to(tl.int32)
            if BY_MASS:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
                w = tl.exp(x - m)
            else:
                w = tl.full([BLOCK], 1.0, tl.float32)
            hit = inr[:, None] & (nib[:, None] == bins[None, :])
            w16 += tl.sum(tl.where(hit, w[:, None], 0.0), axis=0)
        if step == 0 and BY_MASS:
            target = frac * tl.sum(w16, axis=0)
        suf = tl.sum(tl.where(bins[None, :] >= bins[:, None], w16[None, :], 0.0), axis=1)
        b = tl.max(tl.where(above + suf >= target, bins, -1), axis=0)
        found = found & (b >= 0)
        bs = tl.maximum(b, 0)
        above += tl.sum(tl.where(bins > bs, w16, 0.0), axis=0)
        prefix = prefix | (bs.to(tl.uint32) << shift)
    return tl.where(found, prefix, 0)


@triton.jit
def _row_logprobs(row, V, best_i, tok, k, LpI, LpF, BLOCK: tl.constexpr, LP_TOP: tl.constexpr):
    """Log-softmax of one row of raw logits (fp32): the sampled token's value at LpF[0], the top k ids at
    LpI[1..k] and values at LpF[1 + LP_TOP ..]; `best_i` is the row's argmax (first index of the maximum)."""
    m = _no_nan(tl.load(row + best_i).to(tl.float32))
    acc = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = _no_nan(tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32))
        acc += tl.exp(x - m)
    lse = m + tl.log(tl.sum(acc, axis=0))
    tl.store(LpF, _no_nan(tl.load(row + tok).to(tl.float32)) - lse)
    if k > 0:
        tl.store(LpI + 1, best_i)
        tl.store(LpF + 1 + LP_TOP, m - lse)
    pv = m
    pi = best_i
    for i in range(1, k):
        bv = tl.full([], float("-inf"), tl.float32)
        bi = tl.zeros([], tl.int32)
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = _no_nan(tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32))
            below = (offs < V) & ((x < pv) | ((x == pv) & (offs > pi)))
            xs = tl.where(below, x, float("-inf"))
            bm = tl.max(xs, axis=0)
            bj = tl.argmax(xs, axis=0).to(tl.int32) + v0
            bi = tl.where(bm > bv, bj, bi)  # strict: on a tie the earlier block (smaller id) stays
            bv = tl.maximum(bv, bm)
        tl.store(LpI + 1 + i, bi)
        tl.store(LpF + 1 + LP_TOP + i, bv - lse)
        pv = bv
        pi = bi


@triton.jit
def _first_max(row, V, BLOCK: tl.constexpr):
    """First index of the maximum of a row with NaN as -inf, by one program (0 when nothing is above -inf)."""
    bv = tl.full([], float("-inf"), tl.float32)
    bi = tl.zeros([], tl.int32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = _no_nan(tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32))
        bm = tl.max(x, axis=0)
        bj = tl.argmax(x, axis=0).to(tl.int32) + v0
        bi = tl.where(bm > bv, bj, bi)  # strict: on a tie the earlier block (smaller id) stays
        bv = tl.maximum(bv, bm)
    return bi


@triton.jit
def _argmax_chunks_kernel(Logits, stride_l, PartV, PartI, V, CHUNK: tl.constexpr, NCHUNK: tl.constexpr,
                          USE_PDL: tl.constexpr):  # fmt: skip
    """Grid (rows, NCHUNK): the maximum of one CHUNK of a logit row and its first index, into PartV / PartI
    [rows, NCHUNK]; `_sample_kernel` merges a row's chunks (earliest chunk on ties: the row's first maximum)."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(Logits + r.to(tl.int64) * stride_l + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = _no_nan(x)  # lane 0 (< V) then wins every all -inf chunk: never a masked lane
    m = tl.max(x, axis=0)
    i = tl.argmax(x, axis=0, tie_break_left=True).to(tl.int32) + c * CHUNK
    tl.store(PartV + r * NCHUNK + c, m)
    tl.store(PartI + r * NCHUNK + c, i)


@triton.jit
def _merge_argmax(PartV, PartI, r, NCHUNK: tl.constexpr, NCHUNK_P2: tl.constexpr):
    """The first index of a row's maximum from its chunk partials (`_argmax_chunks_kernel`)."""
    c = tl.arange(0, NCHUNK_P2)
    ok = c < NCHUNK
    v = tl.load(PartV + r * NCHUNK + c, mask=ok, other=float("-inf"))
    idx = tl.load(PartI + r * NCHUNK + c, mask=ok, other=0)
    m = tl.max(v, axis=0)
    first = tl.min(tl.where(ok & (v == m), c, NCHUNK_P2), axis=0)
    return tl.sum(tl.where(c == first, idx, 0), axis=0)


@triton.jit
def _sample_kernel(
    Logits, stride_l, Greedy, InvT, TopP, TopK, Seed, Pos, OutSlot, Out, SlotTok, LpK1, LpI, LpF, V,
    BLOCK: tl.constexpr, LP_WORDS: tl.constexpr, LP_TOP: tl.constexpr, USE_PDL: tl.constexpr,
    PartV=None, NCHUNK: tl.constexpr = 0, NCHUNK_P2: tl.constexpr = 1,
):  # fmt: skip
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    row = Logits + r.to(tl.int64) * stride_l
    # Greedy rows take the argmax computed before this kernel by a parallel reduction (one program walking a
    # 152k vocabulary alone is a visible share of a small model's decode step: docs/engine.md, Measured choices);
    # sampled rows need its value too.
    if NCHUNK > 0:  # a constexpr branch: Greedy holds the chunk indices (PartI)
        best_i = _merge_argmax(PartV, Greedy, r, NCHUNK, NCHUNK_P2)
    else:
        best_i = tl.load(Greedy + r).to(tl.int32)
        lead = tl.load(row + best_i).to(tl.float32)
        if lead != lead:  # torch's argmax takes a NaN as the maximum: only then walk the row with NaN as -inf
            best_i = _first_max(row, V, BLOCK)
    tok = best_i
    inv = tl.load(InvT + r)
    if inv > 0:
        best = _no_nan(tl.load(row + best_i).to(tl.float32))
        m = best * inv
        k = tl.load(TopK + r)
        p = tl.load(TopP + r)
        thr = tl.zeros([], tl.uint32)
        if (k > 0) & (k < V):
            thr = tl.maximum(thr, _radix_select(row, V, inv, m, k.to(tl.float32), False, BLOCK))
        if p < 1.0:
            thr = tl.maximum(thr, _radix_select(row, V, inv, m, p, True, BLOCK))
        seed = tl.load(Seed + r).to(tl.uint32, bitcast=True)
        pos = tl.load(Pos + r).to(tl.uint32, bitcast=True)
        hkey = _fmix32(seed ^ _fmix32((pos * 0x9E3779B1) ^ 0x5BD1E995))
        sbest = tl.full([], float("-inf"), tl.float32)
        sbest_i = tl.zeros([], tl.int32)
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            valid = offs < V
            x = _no_nan(tl.load(row + offs, mask=valid, other=0.0).to(tl.float32) * inv)
            h = _fmix32(hkey ^ _fmix32(offs.to(tl.uint32) ^ 0x27D4EB2F))
            u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            score = x - tl.log(-tl.log(u))
            score = tl.where(valid & (_key(x) >= thr), score, float("-inf"))
            bm = tl.max(score, axis=0)
            bi = tl.argmax(score, axis=0).to(tl.int32) + v0
            sbest_i = tl.where(bm > sbest, bi, sbest_i)
            sbest = tl.maximum(sbest, bm)
        tok = sbest_i
    tl.store(Out + r, tok)
    tl.store(SlotTok + tl.load(OutSlot + r), tok)
    k = tl.load(LpK1 + r) - 1
    if k >= 0:
        lp = r.to(tl.int64) * LP_WORDS
        _row_logprobs(row, V, best_i, tok, k, LpI + lp, LpF + lp, BLOCK, LP_TOP)


def sample(logits: torch.Tensor, inv_temp: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
           seed: torch.Tensor, pos: torch.Tensor, out_slot: torch.Tensor, out: torch.Tensor,
           slot_tokens: torch.Tensor, logprobs_k1: torch.Tensor, logprobs_out: torch.Tensor, *,
           pdl: bool = False, argmax_chunk: int = 0) -> None:  # fmt: skip
    """Tokens of logits [L, V] into `out` [L] int32 and `slot_tokens[out_slot]`, log-probabilities of rows with
    `logprobs_k1` > 0 into `logprobs_out`. `argmax_chunk` > 0: greedy argmax by our chunked kernel, else torch's."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    block = min(2048, triton.next_power_of_2(vocab))
    extra: dict = {}
    if argmax_chunk > 0:
        chunk = min(argmax_chunk, triton.next_power_of_2(vocab))
        nchunk = triton.cdiv(vocab, chunk)
        part_v = torch.empty(rows, nchunk, dtype=torch.float32, device=logits.device)
        greedy = torch.empty(rows, nchunk, dtype=torch.int32, device=logits.device)
        _argmax_chunks_kernel[(rows, nchunk)](
            logits, logits.stride(0), part_v, greedy, vocab, CHUNK=chunk, NCHUNK=nchunk, USE_PDL=pdl, num_warps=4,
            **pdl_kwargs(pdl),
        )  # fmt: skip
        extra = {"PartV": part_v, "NCHUNK": nchunk, "NCHUNK_P2": triton.next_power_of_2(nchunk)}
    else:
        # A row with NaN is redone in the sampler (torch takes NaN as the maximum; a NaN-safe pass costs a launch).
        greedy = logits.argmax(dim=-1)
    _sample_kernel[(rows,)](
        logits, logits.stride(0), greedy, inv_temp, top_p, top_k, seed, pos, out_slot, out, slot_tokens,
        logprobs_k1, logprobs_out, logprobs_out.view(torch.float32), vocab,
        BLOCK=block, LP_WORDS=LOGPROB_WORDS, LP_TOP=MAX_LOGPROBS, USE_PDL=pdl, num_warps=8, **pdl_kwargs(pdl),
        **extra,
    )  # fmt: skip
