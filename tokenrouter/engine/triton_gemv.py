"""Triton skinny GEMM for the linear layers of small decode steps: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= 16,
optionally folding SwiGLU or residual add + RMSNorm into x. Grid and constexprs depend only on shapes (graph-safe);
configs come from a table or a shape rule, never autotuning. Design: docs/engine.md, Kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tokenrouter.engine.attention.triton_common import DEFAULT_NUM_SMS
from tokenrouter.engine.attention.triton_common import num_sms as device_sms
from tokenrouter.engine.triton_ops import pdl_kwargs

MAX_ROWS = 16  # largest M of the FMA tiles and of the folds (norm), and of graph decode steps
MAX_DOT_ROWS = 256  # largest M of the tensor-core tiles: one row block (padded to a power of two) per weight tile
FMA_MAX_ROWS = 1  # rows up to this use CUDA-core FMAs, more use tensor cores (faster from M = 2: docs/engine.md)
DOT_ROWS = 16  # token rows of a DOT-path tile (tl.dot needs >= 16)
PREFETCH_BYTES_PER_PROGRAM = 32 * 1024  # L2 prefetch per program before the PDL wait
PRELOAD_BYTES_PER_PROGRAM = 32 * 1024  # weight bytes a program loads into registers before the PDL wait
MAX_PRE_TILES = 4  # the kernel unrolls at most this many pre-loaded tiles
MIN_BLOCK_N = 4  # smallest tile of any config: sizes the arrival-counter buffer


@dataclass(frozen=True, slots=True)
class GemvConfig:
    dot: bool  # tensor-core inner product (rows padded to 16) instead of CUDA-core FMAs
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


# The fastest FMA tile (block_n, block_k) per (N, K) at M = 1 (perf_probe [d]: docs/engine.md, Measured choices):
# Qwen3-8B qkv/o/gate_up/down, then Qwen3-0.6B. Shapes not listed follow `_fma_rule`, which reproduces them.
FMA_TABLE: dict[tuple[int, int], tuple[int, int]] = {(6144, 4096): (16, 512), (4096, 4096): (4, 1024),
                                                     (24576, 4096): (16, 512), (4096, 12288): (4, 1024),
                                                     (4096, 1024): (4, 1024), (1024, 2048): (4, 1024),
                                                     (6144, 1024): (16, 512), (1024, 3072): (4, 1024)}  # fmt: skip
# Tiles for 2..8 rows measured as the engine launches them (gemv_probe --sweep-pdl, H200; docs/engine.md, Measured
# choices), kept where > 3% faster than the rule: (N, K) -> ((largest M, dot, block_n, block_k, stages), ...) ascending.
SMALL_M_TABLE: dict[tuple[int, int], tuple[tuple[int, bool, int, int, int], ...]] = {
    (4096, 1024): ((2, False, 16, 512, 3), (8, True, 64, 256, 3)), (1024, 3072): ((2, False, 4, 1024, 3),),
    (1024, 2048): ((2, False, 4, 1024, 3), (4, False, 4, 512, 3), (8, True, 64, 256, 3))}  # fmt: skip


def _fma_rule(n: int, k: int) -> tuple[int, int]:
    """Wide tiles (16 rows x 512) when that still gives >= 384 programs, else 4 rows x 1024."""
    return (16, 512) if n // 16 >= 384 else (4, 1024)


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


def choose_split_k(n_tiles: int, k: int, block_k: int, num_sms: int, max_split: int = 8) -> int:
    """Smallest power-of-two split whose grid covers the SMs once, every split >= 2 whole K tiles (no masks)."""
    split = 1
    while n_tiles * split < num_sms and split < max_split and k % (2 * split * block_k) == 0:
        if k // (2 * split) < 2 * block_k:
            break
        split *= 2
    return split


def gemv_config(m: int, n: int, k: int, num_sms: int = DEFAULT_NUM_SMS) -> GemvConfig:
    """The launch configuration for M rows against an [N, K] weight (shape-only, graph-stable)."""
    if m <= FMA_MAX_ROWS:
        bn, bk = FMA_TABLE.get((n, k)) or _fma_rule(n, k)
        bk = min(bk, max(16, triton.next_power_of_2(k)))
        bn = min(bn, max(MIN_BLOCK_N, _pow2_floor(n)))
        return GemvConfig(dot=False, block_n=bn, block_k=bk, split_k=1, num_warps=4, num_stages=3)
    for rows, dot, bn, bk, stages in SMALL_M_TABLE.get((n, k), ()):
        if m <= rows:
            return (dot_config(n, k, num_sms, bn, bk, stages) if dot else
                    GemvConfig(dot=False, block_n=bn, block_k=min(bk, k), num_stages=stages))  # fmt: skip
    if m > MAX_ROWS:
        return wide_config(m, n, k, num_sms)
    return dot_config(n, k, num_sms)


def wide_config(m: int, n: int, k: int, num_sms: int = DEFAULT_NUM_SMS) -> GemvConfig:
    """Tensor-core tiles for 17..MAX_DOT_ROWS rows (varlen passes): 64 weight rows x all token rows, so each weight
    tile is read once; shorter K tiles, fewer stages and two warpgroups as the row block grows (shared memory and
    registers: docs/engine.md, Kernels)."""
    wide = m > 64
    cfg = dot_config(n, k, num_sms, block_k=64 if wide else 128, num_stages=3 if wide else 4)
    return GemvConfig(dot=True, block_n=cfg.block_n, block_k=cfg.block_k, split_k=cfg.split_k,
                      num_warps=8 if wide else 4, num_stages=cfg.num_stages)  # fmt: skip


def dot_rows(m: int) -> int:
    """BLOCK_M of the tensor-core tiles: M padded to a power of two, at least 16 (tl.dot's minimum)."""
    return max(DOT_ROWS, triton.next_power_of_2(m))


def dot_config(n: int, k: int, num_sms: int = DEFAULT_NUM_SMS, block_n: int = 64, block_k: int = 128,
               num_stages: int = 4) -> GemvConfig:  # fmt: skip
    """Tensor-core tile (one warpgroup: 64 weight rows x 16 token rows) with split-K up to one wave."""
    bk = min(block_k, max(16, triton.next_power_of_2(k)))
    bn = min(block_n, max(16, triton.next_power_of_2(n)))
    split = choose_split_k(triton.cdiv(n, bn), k, bk, num_sms)
    return GemvConfig(dot=True, block_n=bn, block_k=bk, split_k=split, num_warps=4, num_stages=num_stages)


def num_counters(max_n: int) -> int:
    """Arrival counters that cover any config of a weight with at most `max_n` rows."""
    return triton.cdiv(max_n, MIN_BLOCK_N)


def arrival_counters(max_n: int, device: torch.device | str) -> torch.Tensor:
    """Zeroed int32 split-K arrival counters for weights of <= `max_n` rows (one stream; the kernel leaves 0)."""
    return torch.zeros(num_counters(max_n), dtype=torch.int32, device=device)


# ---- kernel ------------------------------------------------------------------------------------------------
@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the 128-byte line of each address (`prefetch.global.L2`: no result, the thread never waits)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _load_x(ptrs, mask, K, SILU: tl.constexpr, MASKED: tl.constexpr):
    """x at `ptrs` in X's dtype (masked loads only with MASKED); with SILU, X holds gate | up (2K columns) and
    the result is SiLU(gate) * up rounded like HF (silu rounded to the dtype, then the product)."""
    dt = ptrs.dtype.element_ty
    if MASKED:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
        g = tl.load(ptrs, mask=mask, other=0.0)
    else:
        g = tl.load(ptrs)
    if SILU:
        if MASKED:  # noqa: SIM108 - a constexpr branch
            u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        else:
            u = tl.load(ptrs + K).to(tl.float32)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(dt).to(tl.float32)
        x = (s * u).to(dt)
    else:
        x = g
    return x


@triton.jit
def _load_w(ptrs, k_mask, EVEN_K: tl.constexpr):
    """One [BLOCK_N, BLOCK_K] weight tile (K-masked unless EVEN_K)."""
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=k_mask[None, :], other=0.0)


@triton.jit
def _sum_row(X, R, cols, mask, HAS_RES: tl.constexpr):
    """s = x (+ r) of one row in fp32, the residual stream rounded to the dtype like `triton_ops.rms_norm`."""
    s = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + cols, mask=mask, other=0.0).to(tl.float32)
        s = (s + r).to(R.dtype.element_ty).to(tl.float32)
    return s


@triton.jit
def _norm_inv(X, R, RO, offs_m, M, K, eps, stride_xm, stride_rm, stride_rom, store,
              HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, NORM_BLOCK: tl.constexpr):  # fmt: skip
    """1 / RMS of each of the M rows of s = x (+ r) ([BLOCK_M] fp32), each row reduced as a 1-D [NORM_BLOCK]
    vector exactly as `triton_ops.rms_norm` reduces it (same shape, same warps: the same rounding); rows are
    unrolled so their loads are in flight together. Where `store` (one program of the grid), s goes to RO."""
    cols = tl.arange(0, NORM_BLOCK)
    inv = tl.zeros([BLOCK_M], dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        mask = (cols < K) & (m < M)
        s = _sum_row(X + m * stride_xm, R + m * stride_rm, cols, mask, HAS_RES)
        tl.store(RO + m * stride_rom + cols, s.to(RO.dtype.element_ty), mask=mask & store)
        inv_m = tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)
        inv = tl.where(offs_m == m, inv_m, inv)
    return inv


@triton.jit
def _load_normed(X, R, NW, offs_m, kk, mask, K, stride_xm, stride_rm, inv, HAS_RES: tl.constexpr):
    """RMSNorm(s)[:, kk] rounded like `rms_norm`: (s * inv) to the dtype, times the weight, to the dtype."""
    dt = X.dtype.element_ty
    s = tl.load(X + offs_m[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + offs_m[:, None] * stride_rm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        s = (s + r).to(R.dtype.element_ty).to(tl.float32)
    w = tl.load(NW + kk, mask=kk < K, other=0.0).to(tl.float32)
    return ((s * inv[:, None]).to(dt).to(tl.float32) * w[None, :]).to(dt)


@triton.jit
def _load_scaled(X, R, NW, RO, offs_m, kk, mask, K, stride_xm, stride_rm, stride_rom, ss, store,
                 HAS_RES: tl.constexpr):  # fmt: skip
    """(s[:, kk] * norm weight rounded to the dtype, ss + the rows' sums of s^2 over kk) for the late norm (the RMS
    scales the product after the K loop); s = x (+ r) rounded to the dtype, written to RO where `store`."""
    dt = X.dtype.element_ty
    s = tl.load(X + offs_m[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + offs_m[:, None] * stride_rm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        s = (s + r).to(dt).to(tl.float32)
        tl.store(RO + offs_m[:, None] * stride_rom + kk[None, :], s.to(dt), mask=mask & store)
    w = tl.load(NW + kk, mask=kk < K, other=0.0).to(tl.float32)
    return (s * w[None, :]).to(dt), ss + tl.sum(s * s, axis=1)


@triton.jit
def _apply_tile(acc, ss, w, X, R, NW, RO, inv, kk, k_mask, m_mask, offs_m, K, stride_xm, stride_rm, stride_rom,
                store_sum, BLOCK_M: tl.constexpr, USE_DOT: tl.constexpr, SILU: tl.constexpr, EVEN_K: tl.constexpr,
                NORM: tl.constexpr, NORM_RES: tl.constexpr, NORM_LATE: tl.constexpr,
                DOT_PRECISION: tl.constexpr):  # fmt: skip
    """(acc, ss) after this K tile: acc += x[:, kk] (SiLU(gate) * up with SILU, RMSNorm(x (+ r)) with NORM, x (+ r)
    times the norm weight with NORM_LATE, which also grows `ss`, the rows' sums of squares) times the weight tile
    `w` [BLOCK_N, BLOCK_K]."""
    if EVEN_K:  # noqa: SIM108 - a constexpr branch
        x_mask = m_mask[:, None]  # no K mask: x loads stay 16-byte vectors
    else:
        x_mask = m_mask[:, None] & k_mask[None, :]
    if NORM_LATE:
        x, ss = _load_scaled(X, R, NW, RO, offs_m, kk, x_mask, K, stride_xm, stride_rm, stride_rom, ss, store_sum,
                             NORM_RES)  # fmt: skip
    elif NORM:
        x = _load_normed(X, R, NW, offs_m, kk, m_mask[:, None] & k_mask[None, :], K, stride_xm, stride_rm, inv,
                         NORM_RES)  # fmt: skip
    elif USE_DOT or BLOCK_M > 1:
        x = _load_x(X + offs_m[:, None] * stride_xm + kk[None, :], x_mask, K, SILU, True)
    else:
        x = _load_x(X + kk, k_mask, K, SILU, not EVEN_K)
    if USE_DOT:
        acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
    elif BLOCK_M == 1:
        acc += w.to(tl.float32) * tl.reshape(x, [w.shape[1]]).to(tl.float32)[None, :]
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc, ss


@triton.jit
def skinny_gemm_kernel(
    X, W, Bias, Y, Part, Counters, R, NW, RO, SS,
    M, N, K, K_SPLIT, eps,
    stride_xm, stride_wn, stride_ym, stride_rm, stride_rom,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr, PRE_TILES: tl.constexpr,
    NORM: tl.constexpr, NORM_RES: tl.constexpr, NORM_BLOCK: tl.constexpr, NORM_LATE: tl.constexpr = False,
):  # fmt: skip
    """y[:M, n-tile] = x[:M] @ W[n-tile]^T over this program's K slice [k_lo, k_lo + K_SPLIT) (see module doc).

    BLOCK_M: token rows of the tile (DOT: 16; FMA: next power of two >= M). SPLIT: split_k > 1 (Part is fp32
    [split_k, M, N], Counters int32 with one zero entry per N tile). EVEN_K: K is a multiple of K_SPLIT and
    K_SPLIT of BLOCK_K (no K masks). PRE_TILES (0..4): the first K tiles of the slice are loaded before the PDL
    wait (weights never depend on the previous kernel) and applied first, in the loop's order. NORM: the
    kernel's x is RMSNorm(X (+ R with NORM_RES), weight NW) over all K (NORM_BLOCK = next power of two >= K):
    every program takes the rows' RMS first; program (0, 0) writes the sum X + R to RO (never X or R).
    NORM_LATE (instead of NORM): the same product with the RMS applied last, y = (s * NW) @ W^T / RMS(s), so no
    program waits for the RMS before its first tile: each sums s^2 over its K slice as it goes (SS: fp32
    [N tiles, split_k, BLOCK_M] partials, merged in split order by the tile's last arrival) and the programs of N
    tile 0 write their slice of s = X + R to RO. Not HF's rounding (HF rounds s / RMS, then the weight product)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)  # clamped: weight loads need no N mask (stores are masked)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = W + rows_w[:, None] * stride_wn + (k_lo + offs_k)[None, :]
    # Weight tiles loaded before the wait stream while the previous kernel still runs.
    if PRE_TILES >= 1:
        w0 = _load_w(w_ptrs, k_lo + offs_k < k_hi, EVEN_K)
    if PRE_TILES >= 2:
        w1 = _load_w(w_ptrs + BLOCK_K, k_lo + BLOCK_K + offs_k < k_hi, EVEN_K)
    if PRE_TILES >= 3:
        w2 = _load_w(w_ptrs + 2 * BLOCK_K, k_lo + 2 * BLOCK_K + offs_k < k_hi, EVEN_K)
    if PRE_TILES >= 4:
        w3 = _load_w(w_ptrs + 3 * BLOCK_K, k_lo + 3 * BLOCK_K + offs_k < k_hi, EVEN_K)
    if USE_PDL:
        if PREFETCH_LINES > 0:  # weights never depend on the previous kernel: start streaming them now
            line = 128 * 8 // W.dtype.element_ty.primitive_bitwidth  # elements per 128-byte line
            cols = k_lo + tl.arange(0, PREFETCH_LINES) * line
            _prefetch_l2(W + rows_w[:, None] * stride_wn + cols[None, :])
        gdc_wait()
        gdc_launch_dependents()
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    if NORM:
        first = (pid_n == 0) & (pid_k == 0) & NORM_RES
        inv = _norm_inv(X, R, RO, offs_m, M, K, eps, stride_xm, stride_rm, stride_rom, first, NORM_RES, BLOCK_M,
                        NORM_BLOCK)  # fmt: skip
    else:
        inv = tl.zeros([BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    store_sum = pid_n == 0
    n_iter = tl.cdiv(tl.maximum(k_hi - k_lo, 0), BLOCK_K)

    if USE_DOT:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    if PRE_TILES >= 1:
        kk = k_lo + offs_k
        acc, ss = _apply_tile(acc, ss, w0, X, R, NW, RO, inv, kk, kk < k_hi, m_mask, offs_m, K, stride_xm, stride_rm,
                               stride_rom, store_sum, BLOCK_M, USE_DOT, SILU, EVEN_K, NORM, NORM_RES, NORM_LATE,
                               DOT_PRECISION)  # fmt: skip
    if PRE_TILES >= 2:
        kk = k_lo + BLOCK_K + offs_k
        acc, ss = _apply_tile(acc, ss, w1, X, R, NW, RO, inv, kk, kk < k_hi, m_mask, offs_m, K, stride_xm, stride_rm,
                               stride_rom, store_sum, BLOCK_M, USE_DOT, SILU, EVEN_K, NORM, NORM_RES, NORM_LATE,
                               DOT_PRECISION)  # fmt: skip
    if PRE_TILES >= 3:
        kk = k_lo + 2 * BLOCK_K + offs_k
        acc, ss = _apply_tile(acc, ss, w2, X, R, NW, RO, inv, kk, kk < k_hi, m_mask, offs_m, K, stride_xm, stride_rm,
                               stride_rom, store_sum, BLOCK_M, USE_DOT, SILU, EVEN_K, NORM, NORM_RES, NORM_LATE,
                               DOT_PRECISION)  # fmt: skip
    if PRE_TILES >= 4:
        kk = k_lo + 3 * BLOCK_K + offs_k
        acc, ss = _apply_tile(acc, ss, w3, X, R, NW, RO, inv, kk, kk < k_hi, m_mask, offs_m, K, stride_xm, stride_rm,
                               stride_rom, store_sum, BLOCK_M, USE_DOT, SILU, EVEN_K, NORM, NORM_RES, NORM_LATE,
                               DOT_PRECISION)  # fmt: skip
    w_ptrs += PRE_TILES * BLOCK_K
    for i in range(PRE_TILES, n_iter):
        kk = k_lo + i * BLOCK_K + offs_k
        k_mask = kk < k_hi
        w = _load_w(w_ptrs, k_mask, EVEN_K)
        acc, ss = _apply_tile(acc, ss, w, X, R, NW, RO, inv, kk, k_mask, m_mask, offs_m, K, stride_xm, stride_rm,
                               stride_rom, store_sum, BLOCK_M, USE_DOT, SILU, EVEN_K, NORM, NORM_RES, NORM_LATE,
                               DOT_PRECISION)  # fmt: skip
        w_ptrs += BLOCK_K

    if USE_DOT:
        out = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    elif BLOCK_M == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    store_tile(out, Y, Part, Counters, Bias, pid_n, pid_k, offs_m, offs_n, M, N, stride_ym, SPLIT, HAS_BIAS,
               SS, ss, K, eps, NORM_LATE)  # fmt: skip


@triton.jit
def store_tile(out, Y, Part, Counters, Bias, pid_n, pid_k, offs_m, offs_n, M, N, stride_ym,
               SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SS=None, ss=None, K=1, eps=0.0,
               NORM_LATE: tl.constexpr = False):  # fmt: skip
    """Write a program's fp32 tile `out` [BLOCK_M, BLOCK_N] of y (+ bias). SPLIT: it is the partial of K slice
    `pid_k`; it goes to Part [split_k, M, N] and the tile's last arrival at Counters[pid_n] sums every partial in
    split order (deterministic), writes y and resets the counter to 0. NORM_LATE: y is first scaled by each row's
    1 / RMS from `ss`, its sums of squares over the K slice (with SPLIT, every slice's from SS, in split order).
    Shared with studies/engine/tma_gemm.py."""
    n_mask = offs_n < N
    io_mask = (offs_m < M)[:, None] & n_mask[None, :]
    if SPLIT:
        part = Part + (pid_k * M + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(part, out, mask=io_mask)
        if NORM_LATE:
            tl.store(SS + (pid_n * tl.num_programs(1) + pid_k) * out.shape[0] + offs_m, ss)
        # Every thread's partial is stored before this program's arrival is published (barrier + release);
        # the last arrival's acquire then sees all partials of the tile.
        tl.debug_barrier()
        counter = Counters + pid_n
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(1) - 1:
            tl.debug_barrier()
            total = tl.zeros_like(out)  # fp32, as the tile
            for s in range(0, tl.num_programs(1)):
                p = Part + (s * M + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :]
                total += tl.load(p, mask=io_mask, other=0.0, cache_modifier=".cg")
            if NORM_LATE:
                ss_all = tl.zeros_like(ss)
                for s in range(0, tl.num_programs(1)):
                    ss_at = SS + (pid_n * tl.num_programs(1) + s) * out.shape[0] + offs_m
                    ss_all += tl.load(ss_at, cache_modifier=".cg")
                total = total * tl.rsqrt(ss_all / K + eps)[:, None]
            if HAS_BIAS:
                total += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], total.to(Y.dtype.element_ty), mask=io_mask)
            tl.store(counter, 0)
    else:
        if NORM_LATE:
            out = out * tl.rsqrt(ss / K + eps)[:, None]
        if HAS_BIAS:
            out += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(Y.dtype.element_ty), mask=io_mask)


# ---- host side ---------------------------------------------------------------------------------------------
def kernel_constexprs(m: int, n: int, k: int, cfg: GemvConfig, *, silu: bool, bias: bool, dtype: torch.dtype,
                      pdl: bool, prefetch_lines: int, pre_tiles: int = 0, norm: bool = False,
                      norm_res: bool = False, norm_late: bool = False) -> tuple[dict, int]:  # fmt: skip
    """(constexprs of `skinny_gemm_kernel`, K elements per split) for one launch."""
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = k % cfg.split_k == 0 and (k // cfg.split_k) % cfg.block_k == 0
    consts = {"BLOCK_M": dot_rows(m) if cfg.dot else triton.next_power_of_2(m), "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "USE_DOT": cfg.dot, "SILU": silu, "HAS_BIAS": bias, "SPLIT": cfg.split_k > 1,
              "EVEN_K": even_k, "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32", "USE_PDL": pdl,
              "PREFETCH_LINES": prefetch_lines if pdl else 0, "PRE_TILES": pre_tiles, "NORM": norm and not norm_late,
              "NORM_RES": norm_res, "NORM_BLOCK": triton.next_power_of_2(k) if norm and not norm_late else 1,
              "NORM_LATE": norm and norm_late}  # fmt: skip
    return consts, k_split


def pre_tiles(k: int, cfg: GemvConfig, elem_size: int, max_bytes: int = PRELOAD_BYTES_PER_PROGRAM) -> int:
    """Tiles a program loads before the PDL wait: its whole K slice if it fits `max_bytes` and MAX_PRE_TILES, else 0."""
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    tiles = triton.cdiv(k_split, cfg.block_k)
    fit = max_bytes // (cfg.block_n * cfg.block_k * elem_size)
    return tiles if tiles <= min(fit, MAX_PRE_TILES) else 0


def prefetch_lines_per_row(k: int, cfg: GemvConfig, elem_size: int) -> int:
    """128-byte lines per weight row prefetched into L2 before the PDL wait (a power of two, or 0)."""
    lines = min(k // cfg.split_k * elem_size, PREFETCH_BYTES_PER_PROGRAM // cfg.block_n) // 128
    return _pow2_floor(lines) if lines >= 1 else 0


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu: bool = False,
                counters: torch.Tensor | None = None, config: GemvConfig | None = None, out: torch.Tensor | None = None,
                pdl: bool = False, prefetch: bool = True, preload: bool = False, pre_tiles_override: int | None = None,
                num_sms: int | None = None, norm: tuple[torch.Tensor, float] | None = None,
                residual: torch.Tensor | None = None, sum_out: torch.Tensor | None = None,
                norm_late: bool = False) -> torch.Tensor:  # fmt: skip
    """y = x @ weight.T (+ bias) for x [M, K], weight [N, K] (rows contiguous), fp32 accumulation; M <= 16, or up to
    256 on the tensor-core tiles (`wide_config`) without the norm fold.

    `silu`: x is gate|up [M, 2K], y = (SiLU(gate) * up) @ weight.T. `counters`: zeroed split-K arrival counters
    (None: one memset launch). `pre_tiles_override`: exactly that many pre-loaded tiles (tests, ablations). `norm` =
    (weight [K], eps): y = RMSNorm(s) @ weight.T, s = x (+ `residual`, then s goes to `sum_out` [M, K]); with
    `norm_late`, y = (s * weight) @ W.T / RMS(s) instead (the kernel's NORM_LATE: no RMS pass before the tiles)."""
    m = x.shape[0]
    n, k = weight.shape
    _check_operands(x, weight, silu=silu, norm=norm is not None, residual=residual, sum_out=sum_out)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out
    if y.shape != (m, n) or y.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] with a contiguous last dim")
    if m == 0:
        return y
    if config is None:
        config = gemv_config(m, n, k, num_sms if num_sms is not None else device_sms(x.device))
    cfg = config
    if m > MAX_ROWS and not cfg.dot:
        raise ValueError(f"FMA tiles take at most {MAX_ROWS} rows, got {m} (tensor-core tiles: {MAX_DOT_ROWS})")
    tiles = triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        if counters is None:
            counters = torch.zeros(tiles, dtype=torch.int32, device=x.device)
        if counters.numel() < tiles or counters.dtype != torch.int32:
            raise ValueError(f"need >= {tiles} int32 arrival counters, got {counters.numel()} {counters.dtype}")
        part = torch.empty(cfg.split_k, m, n, device=x.device, dtype=torch.float32)
    else:
        part = y
        counters = counters if counters is not None else y
    rows = dot_rows(m) if cfg.dot else triton.next_power_of_2(m)
    late_split = norm is not None and norm_late and cfg.split_k > 1  # every K slice's sums of squares
    ss = torch.empty(tiles * cfg.split_k * rows, device=x.device, dtype=torch.float32) if late_split else part
    pf = prefetch_lines_per_row(k, cfg, weight.element_size()) if (pdl and prefetch) else 0
    pre = _preloaded_tiles(k, cfg, weight.element_size(), preload, pre_tiles_override)
    consts, k_split = kernel_constexprs(m, n, k, cfg, silu=silu, bias=bias is not None, dtype=weight.dtype, pdl=pdl,
                                        prefetch_lines=pf, pre_tiles=pre, norm=norm is not None,
                                        norm_res=residual is not None, norm_late=norm_late)  # fmt: skip
    r = residual if residual is not None else x
    ro = sum_out if sum_out is not None else x
    skinny_gemm_kernel[(tiles, cfg.split_k)](
        x, weight, bias if bias is not None else weight, y, part, counters, r, norm[0] if norm else weight, ro, ss,
        m, n, k, k_split, norm[1] if norm else 0.0,
        x.stride(0), weight.stride(0), y.stride(0), r.stride(0), ro.stride(0),
        **consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kwargs(pdl),
    )  # fmt: skip
    return y


def _check_operands(x: torch.Tensor, weight: torch.Tensor, *, silu: bool, norm: bool, residual: torch.Tensor | None,
                    sum_out: torch.Tensor | None) -> None:  # fmt: skip
    """ValueError for operands `skinny_gemm` cannot take (last dims of stride 1, at most MAX_ROWS rows)."""
    m, k = x.shape[0], weight.shape[1]
    if x.dim() != 2 or x.shape[1] != (2 * k if silu else k):
        raise ValueError(f"x {tuple(x.shape)} does not match weight {tuple(weight.shape)} (silu={silu})")
    if norm and (silu or (residual is not None) != (sum_out is not None)):
        raise ValueError("a norm fold takes no silu, and a residual exactly when a sum_out")
    for t in (residual, sum_out):
        if t is not None and (t.shape != x.shape or t.stride(1) != 1):
            raise ValueError(f"residual and sum_out must be [{m}, {k}] with a contiguous last dim")
    if m > MAX_DOT_ROWS or (norm and m > MAX_ROWS):
        raise ValueError(f"skinny_gemm takes at most {MAX_DOT_ROWS} rows ({MAX_ROWS} with the norm fold), got {m}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a contiguous last dim")


def _preloaded_tiles(k: int, cfg: GemvConfig, elem_size: int, preload: bool, override: int | None) -> int:
    """PRE_TILES of a launch; an override wins, capped at the K slice's tiles (unmasked EVEN_K loads past the
    slice would read the next split's columns)."""
    pre = pre_tiles(k, cfg, elem_size) if preload else 0
    if override is not None:
        if not 0 <= override <= MAX_PRE_TILES:
            raise ValueError(f"pre_tiles_override must be in 0..{MAX_PRE_TILES}, got {override}")
        pre = min(override, triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k))
    return pre
