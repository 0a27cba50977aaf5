"""Triton kernels for the decoder's elementwise stages, one launch each: `rms_norm`, `qk_norm_rope_store` and
`silu_and_mul`, rounded as HF transformers. `pdl=True`: programmatic dependent launch (docs/engine.md, Kernels).
Import only where kernels run (CUDA, or TRITON_INTERPRET=1): the decorators read the switch at import time."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def pdl_kwargs(pdl: bool) -> dict[str, bool]:
    """Extra launch options for a kernel launched with programmatic dependent launch."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def _rms_norm_kernel(
    X, R, W, Y, RO, Idx,
    stride_x, stride_r, stride_y, stride_ro,
    n_cols, eps,
    HAS_RES: tl.constexpr, STORE_SUM: tl.constexpr, GATHER: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    if GATHER:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
        src = tl.load(Idx + row).to(tl.int64)
    else:
        src = row
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + src * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + src * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(RO.dtype.element_ty).to(tl.float32)  # the residual stream is rounded like HF's `residual + x`
    if STORE_SUM:
        tl.store(RO + row * stride_ro + cols, x.to(RO.dtype.element_ty), mask=mask)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * inv).to(Y.dtype.element_ty).to(tl.float32) * w
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
             index: torch.Tensor | None = None, store_sum: bool | None = None, out: torch.Tensor | None = None,
             pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(y, s) with y = RMSNorm(s), s = x [+ residual] ([T, N]), s None unless `store_sum` (default: a residual).
    `index` [R]: rows gathered first (embedding lookup: `index=ids, store_sum=True`). `out`: where y goes."""
    store = residual is not None if store_sum is None else store_sum
    rows = x.shape[0] if index is None else index.shape[0]
    n = x.shape[1]
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype) if out is None else out
    if y.shape != (rows, n) or y.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {n}] with a contiguous last dim, got {tuple(y.shape)}")
    res_out = torch.empty(rows, n, device=x.device, dtype=x.dtype) if store else None
    if rows == 0:
        return y, res_out
    block = triton.next_power_of_2(n)
    r = residual if residual is not None else x
    ro = res_out if res_out is not None else y
    _rms_norm_kernel[(rows,)](
        x, r, weight, y, ro, index if index is not None else x,
        x.stride(0), r.stride(0), y.stride(0), ro.stride(0),
        n, eps,
        HAS_RES=residual is not None, STORE_SUM=store, GATHER=index is not None, BLOCK=block, USE_PDL=pdl,
        num_warps=min(16, max(1, block // 256)), **pdl_kwargs(pdl),
    )  # fmt: skip
    return y, res_out


@triton.jit
def _qk_norm_rope_store_kernel(
    QKV, Pos, CosSin, NormW, Q, KC, VC, Slots,
    stride_qkv, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_cs,
    eps,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr, HEADS: tl.constexpr = 1,
):  # fmt: skip
    """Grid (T, cdiv(NUM_Q + NUM_KV, HEADS)): token t, heads HEADS * pid1 .. + HEADS - 1 of q then k (each row of
    the [HEADS, BLOCK_H] tile one head: its own norm, the same rotation; k heads also store their v)."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    offs = tl.arange(0, BLOCK_H)
    h_ok = h < NUM_Q + NUM_KV
    m = h_ok[:, None] & (offs < HALF)[None, :]
    dt = Q.dtype.element_ty
    src = QKV + t * stride_qkv + h[:, None] * HEAD_DIM + offs[None, :]
    x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
    if HAS_NORM:
        w_off = (h >= NUM_Q).to(tl.int32)[:, None] * HEAD_DIM + offs[None, :]  # row 0: q_norm, row 1: k_norm
        inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM + eps)[:, None]
        w1 = tl.load(NormW + w_off, mask=m, other=0.0).to(tl.float32)
        w2 = tl.load(NormW + w_off + HALF, mask=m, other=0.0).to(tl.float32)
        x1 = ((x1 * inv).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        x2 = ((x2 * inv).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    pos = tl.load(Pos + t).to(tl.int64)
    c_ok = offs < HALF
    cos = tl.load(CosSin + pos * stride_cs + offs, mask=c_ok, other=0.0).to(dt).to(tl.float32)[None, :]
    sin = tl.load(CosSin + pos * stride_cs + HALF + offs, mask=c_ok, other=0.0).to(dt).to(tl.float32)[None, :]
    o1 = (x1 * cos - x2 * sin).to(dt)
    o2 = (x2 * cos + x1 * sin).to(dt)
    is_q = (h < NUM_Q)[:, None]
    q_dst = Q + t * stride_qt + tl.minimum(h, NUM_Q - 1)[:, None] * stride_qh + offs[None, :]
    tl.store(q_dst, o1, mask=m & is_q)
    tl.store(q_dst + HALF, o2, mask=m & is_q)
    if (tl.program_id(1) + 1) * HEADS > NUM_Q:  # this program holds k heads: write them and their v to the caches
        j = tl.maximum(h - NUM_Q, 0)[:, None]
        kv_m = m & (h >= NUM_Q)[:, None]
        slot = tl.load(Slots + t).to(tl.int64)
        kd = KC + slot * stride_ks + j * stride_kh + offs[None, :]
        tl.store(kd, o1, mask=kv_m)
        tl.store(kd + HALF, o2, mask=kv_m)
        vs = QKV + t * stride_qkv + (NUM_Q + NUM_KV + j) * HEAD_DIM + offs[None, :]
        vd = VC + slot * stride_vs + j * stride_vh + offs[None, :]
        tl.store(vd, tl.load(vs, mask=kv_m, other=0.0), mask=kv_m)
        tl.store(vd + HALF, tl.load(vs + HALF, mask=kv_m, other=0.0), mask=kv_m)


ROPE_MAX_PROGRAMS = 1024  # grid size above which heads share a program (CTA launches dominate tiny programs)
ROPE_MAX_HEADS = 16


def rope_heads_per_program(tokens: int, heads: int, max_programs: int | None = None) -> int:
    """Heads of one program of `qk_norm_rope_store`: 1 (a one-warp program per head, the decode steps' grids)
    until the grid would pass `max_programs` (None: ROPE_MAX_PROGRAMS, read at each launch so a study can change it
    between captures), then doubled up to ROPE_MAX_HEADS (shape-only: graph-safe)."""
    limit = ROPE_MAX_PROGRAMS if max_programs is None else max_programs
    hp = 1
    while hp < ROPE_MAX_HEADS and tokens * triton.cdiv(heads, hp) > limit:
        hp *= 2
    return hp


def qk_norm_rope_store(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                       norm_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, *,
                       pdl: bool = False, heads_per_program: int | None = None) -> torch.Tensor:  # fmt: skip
    """From fused qkv [T, (Hq + 2 Hkv) * D]: return rotated (q-normed) q [T, Hq, D]; write rotated (k-normed) k and
    v into the caches at `slot_mapping`. `norm_weight`: [2, D] (q_norm; k_norm) or None; `cos_sin`: fp32 [pos, D].
    `heads_per_program` (a power of two): overrides `rope_heads_per_program` (studies, tests)."""
    t = qkv.shape[0]
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if qkv.stride(1) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("qkv rows and cache head_dim must be contiguous")
    if any(c.stride(0) != c.shape[1] * c.stride(1) for c in (k_cache, v_cache)):
        raise ValueError("KV cache pages must be laid out back to back (slot = page * page_size + offset)")
    heads = num_heads + num_kv_heads
    hp = rope_heads_per_program(t, heads) if heads_per_program is None else heads_per_program
    if hp < 1 or hp & (hp - 1):
        raise ValueError(f"heads_per_program must be a power of two >= 1, got {hp}")
    q = torch.empty(t, num_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    if t == 0:
        return q
    half = head_dim // 2
    nw = norm_weight if norm_weight is not None else qkv
    _qk_norm_rope_store_kernel[(t, triton.cdiv(heads, hp))](
        qkv, positions, cos_sin, nw, q, k_cache, v_cache, slot_mapping,
        qkv.stride(0), q.stride(0), q.stride(1), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(1), v_cache.stride(2), cos_sin.stride(0),
        eps,
        NUM_Q=num_heads, NUM_KV=num_kv_heads, HEAD_DIM=head_dim, HALF=half,
        BLOCK_H=triton.next_power_of_2(half), HAS_NORM=norm_weight is not None, USE_PDL=pdl, HEADS=hp,
        num_warps=hp, **pdl_kwargs(pdl),
    )  # fmt: skip
    return q


@triton.jit
def _silu_and_mul_kernel(X, Y, stride_x, stride_y, n_cols, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dt = Y.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # HF: silu(gate) rounded, then * up
    tl.store(Y + row * stride_y + cols, (s * u).to(dt), mask=mask)


def silu_and_mul(x: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """SiLU(x[:, :N]) * x[:, N:] for x [T, 2N] -> [T, N]."""
    t, n2 = x.shape
    n = n2 // 2
    y = torch.empty(t, n, device=x.device, dtype=x.dtype)
    if t == 0:
        return y
    block = 1024
    _silu_and_mul_kernel[(t, triton.cdiv(n, block))](x, y, x.stride(0), y.stride(0), n, BLOCK=block, USE_PDL=pdl,
                                                     num_warps=4, **pdl_kwargs(pdl))  # fmt: skip
    return y
