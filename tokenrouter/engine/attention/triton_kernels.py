"""Triton kernels of paged decode and extend attention: one forward kernel (a program per row, KV head, query
block and KV split) and the split reduce (docs/engine.md, Kernels). Runtime-bound `range` loops need the
interpreter patch of `triton_compat` (kept as loops for GPU software pipelining)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, start, hi, q_pos, bt_row, K, V, kvh,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, scale_log2, offs_d,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over keys `start .. start + BLOCK_N - 1` (base-2 exponent domain).

    MASKED tiles apply the causal mask and the split end `hi`; unmasked tiles are known to lie entirely
    below every query's position and inside the split, so they skip both (and the page-table bound)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = offs_n < hi
        # Out-of-range keys read the null page instead of past the end of the block table.
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0)
    else:
        page = tl.load(bt_row + offs_n // PAGE_SIZE)
    # int64: page * stride overflows int32 once a per-layer cache passes 2^31 elements.
    page = page.to(tl.int64)
    tok = offs_n % PAGE_SIZE
    k_off = page * stride_kp + tok * stride_ks + kvh * stride_kh
    v_off = page * stride_vp + tok * stride_vs + kvh * stride_vh
    if MASKED:
        # Masked loads, not just masked scores: the null page may hold NaN/inf garbage and 0 * NaN = NaN.
        kv_mask = n_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(K + k_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    elif HEAD_DIM == BLOCK_D:
        k = tl.load(K + k_off[:, None] + offs_d[None, :])
        v = tl.load(V + v_off[:, None] + offs_d[None, :])
    else:
        d_mask = (offs_d < HEAD_DIM)[None, :]
        k = tl.load(K + k_off[:, None] + offs_d[None, :], mask=d_mask, other=0.0)
        v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=d_mask, other=0.0)

    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if MASKED:
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row may have seen no key yet (padding row, or a query below this split): keep it at exactly 0
    # instead of exp2(-inf - -inf) = NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _merge_group_splits(
    MidO, MidLse, Out, tok, kvh, n_active,
    stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, MERGE_CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """out[tok, h] = sum_s 2^lse_s o_s / sum_s 2^lse_s over splits 0..n_active-1 for the GROUP query heads of
    KV head `kvh` (same math as `split_reduce_kernel`), MERGE_CHUNK splits per [GROUP_P2, CHUNK, D] load."""
    offs_g = tl.arange(0, GROUP_P2)
    offs_c = tl.arange(0, MERGE_CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok = offs_g < GROUP
    d_ok = offs_d < HEAD_DIM
    head = kvh * GROUP + offs_g
    tok64 = tok.to(tl.int64)
    lse_base = MidLse + tok64 * stride_lt + head[:, None] * stride_lh
    o_base = MidO + tok64 * stride_mt + head[:, None, None] * stride_mh + offs_d[None, None, :]
    m_run = tl.full([GROUP_P2], float("-inf"), tl.float32)
    l_run = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, BLOCK_D], tl.float32)
    for s0 in range(0, n_active, MERGE_CHUNK):
        s = s0 + offs_c
        ok = g_ok[:, None] & (s < n_active)[None, :]
        # .cg: read from L2, never from a stale L1 line; other SMs wrote these partials.
        lse = tl.load(lse_base + s[None, :], mask=ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(o_base + s[None, :, None] * stride_ms, mask=ok[:, :, None] & d_ok[None, None, :], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m_run, tl.max(lse, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_safe)
        w = tl.exp2(lse - m_safe[:, None])
        l_run = l_run * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(o * w[:, :, None], 1)
        m_run = m_new
    l_safe = tl.where(l_run == 0.0, 1.0, l_run)
    res = acc / l_safe[:, None]
    out_ptrs = Out + tok64 * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, res.to(Out.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _load_halves(Src, off, ok, HEAD_DIM: tl.constexpr):
    """The two halves ([R, HEAD_DIM // 2] fp32) of the heads at element offsets `off` of Src (rows not `ok`: 0)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    m = ok[:, None] & (offs < HALF)[None, :]
    src = Src + off[:, None] + offs[None, :]
    return tl.load(src, mask=m, other=0.0).to(tl.float32), tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _head_sumsq(Src, off, ok, HEAD_DIM: tl.constexpr):
    """[R] fp32 sums of squares of the heads at element offsets `off` of Src (rows not `ok`: 0), each half reduced on
    its own and then added, as `triton_ops.qk_norm_rope_store` does. Called with as many rows as the program has
    warps (one warp a row, that kernel's layout), so each row sums in its order: bit-identical norms."""
    x1, x2 = _load_halves(Src, off, ok, HEAD_DIM)
    return tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)


@triton.jit
def _norm_rope_halves(
    Src, off, ss, pos, ok, CosSin, stride_cs, NormW, eps,
    HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, dt: tl.constexpr,
):  # fmt: skip
    """The two rotated halves ([R, HEAD_DIM // 2] in dt) of the heads at offsets `off` of Src at positions `pos`:
    RMS-normed first (`ss`: their `_head_sumsq`; `NormW`: the weight row) where HAS_NORM, every step rounded and
    written as `triton_ops.qk_norm_rope_store` writes it (same expressions: same FMA contraction)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    m = ok[:, None] & (offs < HALF)[None, :]
    x1, x2 = _load_halves(Src, off, ok, HEAD_DIM)
    if HAS_NORM:
        inv = tl.rsqrt(ss / HEAD_DIM + eps)[:, None]
        w1 = tl.load(NormW + offs).to(tl.float32)[None, :]
        w2 = tl.load(NormW + HALF + offs).to(tl.float32)[None, :]
        x1 = ((x1 * inv).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        x2 = ((x2 * inv).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    cs = CosSin + pos.to(tl.int64)[:, None] * stride_cs + offs[None, :]
    cos = tl.load(cs, mask=m, other=0.0).to(dt).to(tl.float32)
    sin = tl.load(cs + HALF, mask=m, other=0.0).to(dt).to(tl.float32)
    return (x1 * cos - x2 * sin).to(dt), (x2 * cos + x1 * sin).to(dt)


@triton.jit
def _store_q(
    QKV, Out, CosSin, NormW, eps, row, pos, kvh, stride_qt, stride_qh, stride_cs, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, NORM_ROWS: tl.constexpr, dt: tl.constexpr,
):  # fmt: skip
    """Write the GROUP q heads of KV head `kvh` of token `row`, normed and rotated from its raw qkv row, into Out[row]
    (a scratch the program then reads its q tile from, as the unfused kernel reads q: a q computed in the tile's
    layout for the dot came out a bf16 ulp off in places on an H100). NORM_ROWS heads at a time, one warp a head,
    as the K heads (`_store_step_kv`)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    base = row.to(tl.int64) * stride_qt
    dst_row = Out + row.to(tl.int64) * stride_ot
    for c in tl.static_range(0, GROUP, NORM_ROWS):
        g = c + tl.arange(0, NORM_ROWS)
        ok = g < GROUP
        head = kvh * GROUP + g
        off = base + head * stride_qh
        if HAS_NORM:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
            ss = _head_sumsq(QKV, off, ok, HEAD_DIM)
        else:
            ss = tl.zeros([NORM_ROWS], tl.float32)
        q1, q2 = _norm_rope_halves(QKV, off, ss, tl.zeros([NORM_ROWS], tl.int32) + pos, ok, CosSin, stride_cs,
                                   NormW, eps, HEAD_DIM, HAS_NORM, dt)  # fmt: skip
        dst = (dst_row + head * stride_oh)[:, None] + offs[None, :]
        m = ok[:, None] & (offs < HALF)[None, :]
        tl.store(dst, q1, mask=m)
        tl.store(dst + HALF, q2, mask=m)


@triton.jit
def _step_window(RowSlots, Positions, row, HAS_SLOTS: tl.constexpr, ROW_TOKENS: tl.constexpr,
                 ROW_TOKENS_P2: tl.constexpr):  # fmt: skip
    """The row slots and positions of rows `row`, `row` - 1, .. (ROW_TOKENS of them, -1 past the first row), read for
    `_step_tokens`; loaded apart from it so the loads go out with the kernel's first ones."""
    if HAS_SLOTS:
        r = row - tl.arange(0, ROW_TOKENS_P2)
        back = (tl.arange(0, ROW_TOKENS_P2) < ROW_TOKENS) & (r >= 0)
        return tl.load(RowSlots + r, mask=back, other=-1), tl.load(Positions + r, mask=back, other=-1)
    else:
        return 0, 0


@triton.jit
def _step_tokens(win_slot, win_pos, pos, slot_row, HAS_SLOTS: tl.constexpr, ROW_TOKENS: tl.constexpr,
                 ROW_TOKENS_P2: tl.constexpr):  # fmt: skip
    """How many of this step's tokens the row's request has up to and including its own (1 without row slots): a
    graph step lays a row of up to ROW_TOKENS tokens out as consecutive decode rows sharing a row slot, positions
    rising by one, so they are the rows back from it (`_step_window`) with its slot and positions pos - j."""
    n_new = 1
    if HAS_SLOTS:
        j = tl.arange(0, ROW_TOKENS_P2)
        same = (j < ROW_TOKENS) & (win_slot == slot_row) & (win_pos == pos - j)
        n_new = tl.min(tl.where(same, ROW_TOKENS, j), axis=0)  # the first row back that is not this request's
    return n_new


@triton.jit
def _store_step_kv(
    QKV, K, V, Slots, CosSin, NormW, eps, row, pos, n_new, seq_len, lo, hi, kvh, num_q, num_kv,
    stride_qt, stride_qh, stride_cs, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_NORM: tl.constexpr, NORM_ROWS: tl.constexpr,
    dt: tl.constexpr,
):  # fmt: skip
    """Write KV head `kvh` of this step's new tokens whose keys fall in [lo, hi) into the paged cache: the k-normed,
    rotated key and the raw value from the qkv rows, at their `Slots`. The new tokens: the `n_new` rows back from
    `row` (`_step_tokens`: this row's own token, key seq_len - 1, and the same request's earlier tokens of this
    step). Every program that reads such a key writes it itself (several write the same bits), so no program waits
    on another."""
    # Token j rows back holds key seq_len - 1 - j: inside [lo, hi) for j in [seq_len - hi, seq_len - lo).
    j_end = tl.minimum(n_new, seq_len - lo)
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    offs_d = tl.arange(0, HEAD_DIM)
    for j0 in range(tl.maximum(seq_len - hi, 0), j_end, NORM_ROWS):
        jj = j0 + tl.arange(0, NORM_ROWS)
        ok = jj < j_end
        tok = (row - jj).to(tl.int64)
        k_off = tok * stride_qt + (num_q + kvh) * stride_qh
        if HAS_NORM:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
            ss = _head_sumsq(QKV, k_off, ok, HEAD_DIM)
        else:
            ss = tl.zeros([NORM_ROWS], tl.float32)
        k1, k2 = _norm_rope_halves(QKV, k_off, ss, pos - jj, ok, CosSin, stride_cs, NormW + HEAD_DIM, eps, HEAD_DIM,
                                   HAS_NORM, dt)  # fmt: skip
        slot = tl.load(Slots + tok, mask=ok, other=0).to(tl.int64)
        page, in_page = slot // PAGE_SIZE, slot % PAGE_SIZE
        k_dst = (K + page * stride_kp + in_page * stride_ks + kvh * stride_kh)[:, None] + offs[None, :]
        m = ok[:, None] & (offs < HALF)[None, :]
        tl.store(k_dst, k1, mask=m)
        tl.store(k_dst + HALF, k2, mask=m)
        v_src = QKV + (k_off + num_kv * stride_qh)[:, None] + offs_d[None, :]
        v_dst = (V + page * stride_vp + in_page * stride_vs + kvh * stride_vh)[:, None] + offs_d[None, :]
        m_d = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        tl.store(v_dst, tl.load(v_src, mask=m_d, other=0.0), mask=m_d)


# Runtime ints are not specialized (== 1, % 16): their values change with the batch, and each specialization
# would be another JIT compile in the middle of serving.
@triton.jit(do_not_specialize=["num_splits", "num_q_blocks", "split_keys", "split_programs"])
def paged_attention_fwd_kernel(
    Q, K, V, BlockTables, SeqLens, CuSeqlensQ, Out, MidO, MidLse, Counters, RowSlots,
    Positions, CosSin, NormW, Slots,
    scale_log2, num_splits, num_q_blocks, split_keys, split_programs, eps,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    stride_ot, stride_oh, stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_cs,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IS_DECODE: tl.constexpr, SINGLE_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FUSED_REDUCE: tl.constexpr, GROUP_P2: tl.constexpr, MERGE_CHUNK: tl.constexpr, USE_PDL: tl.constexpr,
    HAS_SLOTS: tl.constexpr, DYN_SPLITS: tl.constexpr, ROWS_P2: tl.constexpr,
    FUSED_ROPE: tl.constexpr, HAS_NORM: tl.constexpr, ROW_TOKENS: tl.constexpr, ROW_TOKENS_P2: tl.constexpr,
    NORM_ROWS: tl.constexpr,
):  # fmt: skip
    """Grid (rows, Hkv * num_q_blocks, num_splits). Q/Out are `[T, Hq, D]`, MidO `[T, Hq, S, D]` fp32,
    MidLse `[T, Hq, S]` fp32; head_dim strides are 1. Decode passes IS_DECODE (token index = row).
    FUSED_REDUCE (with splits): the last split of each (row, KV head, query block) to arrive merges the block's
    tokens; Counters is int32 `[rows * Hkv * num_q_blocks]`, all zero on entry and exit.
    HAS_SLOTS: row r reads the page-table row `RowSlots[r]` of BlockTables.
    DYN_SPLITS (with FUSED_REDUCE): a query block seeing kv_end keys uses only min(num_splits, cdiv(kv_end,
    split_keys)) >= 1 splits; the grid's other splits return at once, and a block left with one split writes Out
    directly (no partials, no counter). Graphs size the grid for the longest row; short rows then cost nothing.
    With split_programs > 0 also at most max(1, split_programs // (busy query blocks x Hkv)) splits: the launch's busy
    blocks are counted from CuSeqlensQ (ROWS_P2 >= rows), the same count in every program, so a few rows split and
    many do not (the grid already fills the GPU).
    FUSED_ROPE (decode, HEAD_DIM a power of two): Q is the q part of the raw qkv rows (K and V heads follow at head
    offsets num_q + h and num_q + num_kv + h of stride_qh); each program norms (HAS_NORM: NormW [2, D] q | k weights)
    and rotates (CosSin [pos, D] fp32 at Positions) its q heads itself, through Out as a scratch (`_store_q`), and
    writes the step's new K/V of its KV head and key range into the cache at Slots before it reads them
    (`_store_step_kv`; ROW_TOKENS: a row's most tokens). NORM_ROWS = num_warps: one warp a head, the layout of
    `triton_ops.qk_norm_rope_store`, so the norms sum in its order. The loads that need nothing loaded (position,
    row slot, the walk-back window) go out with seq_len's, before any of them is waited on."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0)
    pid1 = tl.program_id(1)
    split = tl.program_id(2)
    kvh = pid1 // num_q_blocks
    q_blk = pid1 % num_q_blocks

    seq_len = tl.load(SeqLens + row)
    if FUSED_ROPE:
        # The loads that need nothing loaded go out together: at small batches this kernel's time is its chain of
        # dependent loads (a warp stalls at the first instruction that needs a load's value, so order matters).
        pos = tl.load(Positions + row)
        if HAS_SLOTS:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
            bt_idx = tl.load(RowSlots + row).to(tl.int64)
        else:
            bt_idx = row.to(tl.int64)
        win_slot, win_pos = _step_window(RowSlots, Positions, row, HAS_SLOTS, ROW_TOKENS, ROW_TOKENS_P2)
    if IS_DECODE:
        tok0 = row
        q_len = 1
    else:
        tok0 = tl.load(CuSeqlensQ + row)
        q_len = tl.load(CuSeqlensQ + row + 1) - tok0
    q_begin = q_blk * BLOCK_Q
    if q_begin >= q_len:
        # This row has fewer queries than the grid's max_q_len: nothing of it maps to this program.
        return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    qi = q_begin + offs_m // GROUP_PAD
    g = offs_m % GROUP_PAD
    row_ok = (qi < q_len) & (g < GROUP)
    head = kvh * GROUP + g
    tok = tok0 + qi
    q_pos = seq_len - q_len + qi
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    if not FUSED_ROPE:  # fused: q goes through Out (written and read back below)
        q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=io_mask,
                    other=0.0)  # fmt: skip

    # Keys this query block can see end at its last query's position; slice that range into splits.
    kv_end = seq_len - q_len + tl.minimum(q_len, q_begin + BLOCK_Q)
    if DYN_SPLITS:
        n_act = tl.minimum(tl.maximum(tl.cdiv(kv_end, split_keys), 1), num_splits)
        if split_programs > 0:
            r = tl.arange(0, ROWS_P2)
            r_ok = r < tl.num_programs(0)
            q_lens = tl.load(CuSeqlensQ + r + 1, mask=r_ok, other=0) - tl.load(CuSeqlensQ + r, mask=r_ok, other=0)
            busy = tl.sum(tl.cdiv(q_lens, BLOCK_Q), axis=0) * (tl.num_programs(1) // num_q_blocks)
            n_act = tl.minimum(n_act, tl.maximum(split_programs // tl.maximum(busy, 1), 1))
        if split >= n_act:
            return
    else:
        n_act = num_splits
    split_len = tl.cdiv(tl.cdiv(kv_end, n_act), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, kv_end)
    # Whole tiles below the block's first query position need no causal mask. Clamped to >= lo so the
    # floor division only ever sees non-negative values (GPU truncates, the interpreter floors).
    full_hi = tl.maximum(tl.minimum(hi, seq_len - q_len + q_begin + 1), lo)
    full_end = lo + ((full_hi - lo) // BLOCK_N) * BLOCK_N

    if not FUSED_ROPE:  # fused: loaded at the top
        if HAS_SLOTS:  # noqa: SIM108 - a constexpr branch, kept as a statement for Triton
            bt_idx = tl.load(RowSlots + row).to(tl.int64)
        else:
            bt_idx = row.to(tl.int64)
    bt_row = BlockTables + bt_idx * stride_bt
    if FUSED_ROPE:
        _store_q(Q, Out, CosSin, NormW, eps, row, pos, kvh, stride_qt, stride_qh, stride_cs, stride_ot, stride_oh,
                 GROUP, HEAD_DIM, HAS_NORM, NORM_ROWS, K.dtype.element_ty)  # fmt: skip
        n_new = _step_tokens(win_slot, win_pos, pos, bt_idx, HAS_SLOTS, ROW_TOKENS, ROW_TOKENS_P2)
        _store_step_kv(
            Q, K, V, Slots, CosSin, NormW, eps, row, pos, n_new, seq_len, lo, hi, kvh,
            GROUP * tl.num_programs(1), tl.num_programs(1),
            stride_qt, stride_qh, stride_cs, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            HEAD_DIM, PAGE_SIZE, HAS_NORM, NORM_ROWS, K.dtype.element_ty,
        )  # fmt: skip
        tl.debug_barrier()  # this program's q and K/V stores before its loads of them, by any of its threads
        q = tl.load(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :], mask=io_mask,
                    other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start, hi, q_pos, bt_row, K, V, kvh,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, scale_log2, offs_d,
            PAGE_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, False, DOT_PRECISION,
        )  # fmt: skip
    for start in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start, hi, q_pos, bt_row, K, V, kvh,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, scale_log2, offs_d,
            PAGE_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, True, DOT_PRECISION,
        )  # fmt: skip

    # l_i == 0 means no visible key in this slice (or seq_len == 0): output 0, lse -inf (a neutral partial).
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    # A constexpr branch, then a runtime one (Triton compiles only the taken constexpr side): DYN_SPLITS blocks
    # left with one split write Out too; otherwise n_act == num_splits > 1 there.
    if SINGLE_SPLIT:  # noqa: SIM114
        out_ptrs = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, o.to(Out.dtype.element_ty), mask=io_mask)
    elif n_act == 1:
        out_ptrs = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, o.to(Out.dtype.element_ty), mask=io_mask)
    else:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        mid_ptrs = MidO + tok[:, None] * stride_mt + head[:, None] * stride_mh + split * stride_ms + offs_d[None, :]
        tl.store(mid_ptrs, o, mask=io_mask)
        tl.store(MidLse + tok * stride_lt + head * stride_lh + split, lse, mask=row_ok)
        if FUSED_REDUCE:
            # Every thread's partial stores happen before this program's arrival is published (barrier +
            # release); the last arrival's acquire then sees all of them.
            tl.debug_barrier()
            counter = Counters + row * tl.num_programs(1) + pid1
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == n_act - 1:
                tl.debug_barrier()
                tl.store(counter, 0)
                n_active = tl.minimum(tl.where(split_len > 0, tl.cdiv(kv_end, tl.maximum(split_len, 1)), 0), n_act)
                if IS_DECODE:
                    _merge_group_splits(
                        MidO, MidLse, Out, tok0, kvh, n_active,
                        stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh,
                        GROUP, GROUP_P2, MERGE_CHUNK, HEAD_DIM, BLOCK_D,
                    )  # fmt: skip
                else:  # every token of the query block (splits past a token's keys hold neutral partials)
                    for t in tl.static_range(BLOCK_Q):
                        if q_begin + t < q_len:
                            _merge_group_splits(
                                MidO, MidLse, Out, tok0 + q_begin + t, kvh, n_active,
                                stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh,
                                GROUP, GROUP_P2, MERGE_CHUNK, HEAD_DIM, BLOCK_D,
                            )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits", "cu_rows"])
def split_reduce_kernel(
    MidO, MidLse, Out, CuSeqlensQ, num_splits, cu_rows,
    stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Grid (T, Hq): out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m). Empty splits (lse -inf) weigh 0;
    a token with no visible key at all (seq_len 0) gets 0, not NaN. Extend (`cu_rows` > 0): only the tokens
    `CuSeqlensQ[0] .. CuSeqlensQ[cu_rows] - 1` of this launch's rows; decode (`cu_rows` == 0): every token."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    tok = tl.program_id(0)
    head = tl.program_id(1)
    # Tokens outside this launch's rows have no partials in MidO/MidLse (uninitialized memory) and may belong to
    # another launch writing the same Out: a varlen graph's other row group, which may run before this one.
    # (Decode reads CuSeqlensQ[0], a valid placeholder, and keeps every token.)
    tok_lo = tl.load(CuSeqlensQ)
    tok_hi = tl.load(CuSeqlensQ + cu_rows)
    if (cu_rows > 0) & ((tok < tok_lo) | (tok >= tok_hi)):
        return
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse = tl.load(MidLse + tok * stride_lt + head * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    denom = tl.sum(w, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    o_ptrs = MidO + tok * stride_mt + head * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :]
    o = tl.load(o_ptrs, mask=s_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    res = tl.sum(o * w[:, None], 0) / denom
    tl.store(Out + tok * stride_ot + head * stride_oh + offs_d, res.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
