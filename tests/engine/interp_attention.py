"""Triton attention kernels vs the torch reference in Triton's CPU interpreter. Run by
test_attention.py::test_triton_kernels_in_interpreter in a child process with TRITON_INTERPRET=1 (the file name
keeps pytest from collecting it in the main run, where the interpreter's patches would leak into real GPU
compilation); `TRITON_INTERPRET=1 python -m pytest tests/engine/interp_attention.py` runs it directly."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from attention_cases import cu_seqlens, make_case, nan_like, oracle, rel_err

from tokenrouter.engine.attention import decode_attention, extend_attention, split_counters
from tokenrouter.engine.triton_compat import squeeze_index


@pytest.fixture(scope="module")
def tri():
    """The Triton attention modules, decorated in interpreter mode (this process is the interpreter's alone)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("run with TRITON_INTERPRET=1 (test_attention.py does)")
    import triton.runtime.interpreter as interpreter

    if hasattr(interpreter, "_patch_lang_tensor"):
        interpreter._patch_lang_tensor = squeeze_index(interpreter._patch_lang_tensor)
    from tokenrouter.engine.attention import triton_common, triton_decode, triton_extend, triton_kernels

    assert isinstance(triton_kernels.paged_attention_fwd_kernel, interpreter.InterpretedFunction)
    return SimpleNamespace(common=triton_common, decode=triton_decode, extend=triton_extend)


SMALL = {"block_n": 16, "block_m": 16}  # several KV tiles and query blocks even on ~40-token rows


@pytest.mark.parametrize(
    ("page_size", "num_heads", "num_kv_heads", "head_dim", "num_splits", "small"),
    [
        (4, 4, 2, 16, 1, True),  # single split writes out directly; unmasked + masked tiles
        (4, 4, 2, 16, 3, True),  # splits; row with seq_len 1 has empty splits
        (16, 6, 2, 32, 5, True),  # non-power-of-two group padded to 16 rows; many empty splits
        (16, 4, 2, 32, 2, False),  # default 64-key tiles
        (4, 4, 2, 16, None, False),  # heuristic split count
    ],
)
def test_triton_decode_matches_reference(tri, page_size, num_heads, num_kv_heads, head_dim, num_splits, small) -> None:
    lens = [37, 1, 20]
    case = make_case(lens, num_kv_heads, head_dim, page_size, seed=5)
    q = torch.randn(len(lens), num_heads, head_dim, generator=torch.Generator().manual_seed(6))
    scale = head_dim**-0.5
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale)
    ref = decode_attention(*args, backend="torch")
    config = tri.common.KernelConfig(**SMALL) if small else tri.common.DECODE_CONFIG
    out = tri.decode.decode_attention_triton(*args, out=nan_like(q), num_splits=num_splits, config=config)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-4
    assert rel_err(out, oracle(q, case, [1] * len(lens), scale)) < 1e-4


class _NoReduce:
    """Stands in for the split reduce kernel where the fused merge must not launch it."""

    def __getitem__(self, grid):
        raise AssertionError("split_reduce_kernel launched although the splits merge in the forward kernel")


@pytest.mark.parametrize(
    ("page_size", "num_heads", "num_kv_heads", "head_dim", "num_splits", "small", "merge_elems"),
    [
        (4, 4, 2, 16, 3, True, 8192),  # all active splits merged in one chunk
        (4, 4, 2, 16, 5, True, 64),  # 2 splits per chunk: several merge rounds, a partial last chunk
        (16, 6, 2, 32, 5, True, 96),  # group 3 padded to 4, one split per chunk
        (16, 8, 1, 16, 7, True, 8192),  # group 8, a single KV head
        (4, 4, 2, 16, None, False, 8192),  # heuristic split count, default tiles
    ],
)
def test_triton_decode_fused_merge(
    tri, monkeypatch, page_size, num_heads, num_kv_heads, head_dim, num_splits, small, merge_elems
) -> None:
    """Splits merged by the last program of each (row, KV head): one launch, same result as the reduce
    kernel, every output element written, counters back to zero so a second launch (graph replay) works."""
    lens = [37, 1, 20, 0, 64]  # long rows, a 1-token row (empty splits), a zero-length padding row
    case = make_case(lens, num_kv_heads, head_dim, page_size, seed=13)
    gen = torch.Generator().manual_seed(14)
    scale = head_dim**-0.5
    cfg = tri.common.KernelConfig(**(SMALL if small else {}), merge_elems=merge_elems)
    counters = split_counters(len(lens) + 3, num_kv_heads, "cpu")  # larger than needed: only a prefix is used
    monkeypatch.setattr(tri.common, "split_reduce_kernel", _NoReduce())
    for _ in range(2):
        q = torch.randn(len(lens), num_heads, head_dim, generator=gen)
        args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale)
        out = tri.decode.decode_attention_triton(
            *args, out=nan_like(q), num_splits=num_splits, config=cfg, counters=counters
        )
        assert not out.isnan().any()
        assert out[3].eq(0).all()
        assert rel_err(out, oracle(q, case, [1] * len(lens), scale)) < 1e-4
        assert counters.eq(0).all()


def test_fused_merge_on_a_grid_much_wider_than_the_rows(tri, monkeypatch) -> None:
    """A graph's grid is sized for the block table's width: at 64 splits, a 20-key row holds keys in 2 splits of
    16 and 62 splits of its KV head are empty; the merge must weigh only the 2 and leave the counters at zero."""
    lens = [20, 1, 0, 3]
    case = make_case(lens, 2, 16, 4, seed=17)
    q = torch.randn(len(lens), 4, 16, generator=torch.Generator().manual_seed(18))
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25)
    counters = split_counters(len(lens), 2, "cpu")
    monkeypatch.setattr(tri.common, "split_reduce_kernel", _NoReduce())
    cfg = tri.common.KernelConfig(**SMALL)
    for _ in range(2):
        out = tri.decode.decode_attention_triton(*args, out=nan_like(q), num_splits=64, config=cfg, counters=counters)
        assert not out.isnan().any() and out[2].eq(0).all()
        assert rel_err(out, oracle(q, case, [1] * len(lens), 0.25)) < 1e-4
        assert counters.eq(0).all()


def test_fused_merge_falls_back_to_reduce_kernel(tri) -> None:
    """Counters too small for the batch, or one split: the reduce-kernel / single-pass paths, same result."""
    case = make_case([30, 9], 2, 16, 4, seed=15)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(16))
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25)
    ref = decode_attention(*args, backend="torch")
    small = split_counters(1, 2, "cpu")
    cfg = tri.common.KernelConfig(**SMALL)
    for splits, counters in ((3, small), (1, split_counters(2, 2, "cpu"))):
        out = tri.decode.decode_attention_triton(
            *args, out=nan_like(q), num_splits=splits, config=cfg, counters=counters
        )
        assert rel_err(out, ref) < 1e-4 and counters.eq(0).all()
    # The package entry point passes counters through.
    out = decode_attention(*args, num_splits=2, backend="triton", counters=split_counters(2, 2, "cpu"))
    assert rel_err(out, ref) < 1e-4


def test_merge_chunk_sizes(tri) -> None:
    chunk = tri.common.merge_chunk
    cfg = tri.common.DECODE_CONFIG
    assert chunk(33, 4, 128, cfg) == 16  # Qwen3-8B: 4 heads x 16 splits x 128 dims = 8192 fp32
    assert chunk(33, 2, 128, cfg) == 32 and chunk(33, 8, 128, cfg) == 8
    assert chunk(3, 2, 128, cfg) == 4  # never more than the (padded) split count
    assert chunk(9, 16, 256, cfg) == 2 and chunk(9, 64, 256, cfg) == 1


@pytest.mark.parametrize(
    ("page_size", "num_heads", "num_kv_heads", "head_dim", "num_splits", "small", "max_q_len"),
    [
        (4, 4, 2, 16, 1, True, 9),
        (4, 4, 2, 16, 3, True, 9),  # splits cut through the causal band of a prefill
        (16, 6, 2, 32, 2, True, 16),  # graph-bucket bound above the real max: extra query blocks exit early
        (16, 4, 2, 32, None, False, None),  # heuristic splits; max_q_len read from cu_seqlens_q
    ],
)
def test_triton_extend_matches_reference(
    tri, page_size, num_heads, num_kv_heads, head_dim, num_splits, small, max_q_len
) -> None:
    q_lens = [9, 3, 1, 0, 6]
    lens = [9, 33, 13, 7, 21]
    case = make_case(lens, num_kv_heads, head_dim, page_size, seed=7)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(8))
    scale = head_dim**-0.5
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, scale)
    ref = extend_attention(*args, backend="torch")
    config = tri.common.KernelConfig(**SMALL) if small else tri.common.EXTEND_CONFIG
    out = tri.extend.extend_attention_triton(
        *args, max_q_len=max_q_len, out=nan_like(q), num_splits=num_splits, config=config
    )
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-4
    assert rel_err(out, oracle(q, case, q_lens, scale)) < 1e-4


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "num_splits", "max_q_len", "merge_elems"),
    [
        (4, 2, 3, 9, 8192),  # group 2: 8-token query blocks, two blocks for the 9-token row
        (8, 2, 5, 16, 64),  # group 4: 4-token blocks, a bucket bound above the real max, chunked merge
        (16, 2, 2, None, 8192),  # group 8: 2-token blocks; max_q_len read from cu_seqlens_q
    ],
)
def test_triton_extend_fused_merge(tri, monkeypatch, num_heads, num_kv_heads, num_splits, max_q_len,
                                   merge_elems) -> None:  # fmt: skip
    """Extend launches with counters and short query blocks merge their splits in the forward kernel (no reduce
    launch): the reference's output for every token, a zero-query row untouched, counters back to zero for the
    next launch (two launches in a row, as graph replays)."""
    q_lens, lens = [9, 3, 1, 0, 6], [9, 33, 13, 7, 21]
    case = make_case(lens, num_kv_heads, 16, 4, seed=31)
    cfg = tri.common.KernelConfig(**SMALL, merge_elems=merge_elems)
    counters = split_counters(len(lens) * 8, num_kv_heads, "cpu")  # rows x query blocks (5 at group 8)
    monkeypatch.setattr(tri.common, "split_reduce_kernel", _NoReduce())
    gen = torch.Generator().manual_seed(32)
    for _ in range(2):
        q = torch.randn(sum(q_lens), num_heads, 16, generator=gen)
        args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
        out = tri.extend.extend_attention_triton(*args, max_q_len=max_q_len, out=nan_like(q), num_splits=num_splits,
                                                 config=cfg, counters=counters)  # fmt: skip
        assert not out.isnan().any()
        assert rel_err(out, oracle(q, case, q_lens, 0.25)) < 1e-4
        assert counters.eq(0).all()


def test_triton_extend_long_blocks_keep_the_reduce_kernel(tri) -> None:
    """Query blocks longer than FUSED_EXTEND_MAX_Q (group 2 with 64-row tiles: 32 tokens) go through the reduce
    kernel even with counters, which stay untouched."""
    q_lens, lens = [20, 3], [40, 33]
    case = make_case(lens, 2, 16, 4, seed=33)
    q = torch.randn(sum(q_lens), 4, 16, generator=torch.Generator().manual_seed(34))
    counters = split_counters(8, 2, "cpu")
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
    block_q, _ = tri.extend.extend_tiling(20, 2, tri.common.EXTEND_CONFIG)
    assert block_q > tri.common.FUSED_EXTEND_MAX_Q
    out = tri.extend.extend_attention_triton(*args, out=nan_like(q), num_splits=3, counters=counters)
    assert rel_err(out, oracle(q, case, q_lens, 0.25)) < 1e-4 and counters.eq(0).all()


def test_public_dispatch_runs_triton(tri) -> None:
    """`backend="triton"` through the package API, prefill + decode on the same cache (16-token pages)."""
    case = make_case([23, 4], 2, 16, 16, seed=11)
    gen = torch.Generator().manual_seed(12)
    q_lens = [23, 4]
    q = torch.randn(27, 4, 16, generator=gen)
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
    out = extend_attention(*args, max_q_len=23, backend="triton")
    assert rel_err(out, extend_attention(*args, backend="torch")) < 1e-4
    qd = torch.randn(2, 4, 16, generator=gen)
    dargs = (qd, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25)
    out = decode_attention(*dargs, num_splits=2, backend="triton")
    assert rel_err(out, decode_attention(*dargs, backend="torch")) < 1e-4


def test_triton_zero_length_rows_give_zeros(tri) -> None:
    """A padded CUDA-graph row may carry seq_len 0: its output must be finite (zeros), never NaN."""
    case = make_case([6, 0], 2, 16, 4, seed=9)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(10))
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25)
    ref = decode_attention(*args, backend="torch")
    for splits in (1, 2):
        out = tri.decode.decode_attention_triton(*args, out=nan_like(q), num_splits=splits)
        assert out[1].eq(0).all() and rel_err(out, ref) < 1e-4


def test_split_heuristic_values(tri) -> None:
    choose = tri.common.choose_num_splits
    assert choose(8, 128, 132) == 1  # short context: never split
    assert choose(8, 8192, 132) == 32  # batch 1 x 8 KV heads at 8k: capped by 256 tokens per split
    assert choose(256, 8192, 132) == 3  # big batch: little splitting
    assert all(choose(p, 8192, 132) >= choose(2 * p, 8192, 132) for p in (8, 32, 128, 512))


@pytest.mark.parametrize(
    ("small", "long_splits", "short_splits"),
    [
        (False, 5, 2),  # the live Qwen3-0.6B bucket-48 step: production tiles, both groups split
        (True, 1, 3),  # only the short group splits: its reduce must not touch the long group's tokens
        (True, 3, 1),  # only the long group splits: the short group's tokens, written first, survive
        (False, None, None),  # split counts from the heuristic, as the engine launches them
    ],
)
def test_triton_extend_row_groups_share_one_output(tri, small, long_splits, short_splits) -> None:
    """A varlen graph launches its two row groups (`varlen_shapes`) into one output: long rows with max_q_len = T,
    then short rows with the short bound. Each launch, split reduce included, must write only its own rows'
    tokens: the other group's tokens and the bucket's padding tokens stay as they were."""
    long_q, short_q = [38, 0, 0, 0], [1, 1, 1, 0]  # a sampled prefill + 3 padding rows; 3 decode rows + 1
    lens = [38, 1, 1, 1, 309, 276, 170, 1]  # padding rows: seq_len 1, zero queries
    bucket, n_long = 48, len(long_q)
    case = make_case(lens, 2, 16, 16, seed=21)
    q = torch.randn(bucket, 4, 16, generator=torch.Generator().manual_seed(22))
    cu = torch.tensor([0, *torch.tensor(long_q + short_q).cumsum(0).tolist()], dtype=torch.int32)
    real = int(cu[-1])  # tokens real..bucket-1 are the bucket's padding: no row owns them
    config = tri.common.KernelConfig(**SMALL) if small else tri.common.EXTEND_CONFIG
    counters = split_counters(bucket, 2, "cpu")  # the engine's: one buffer for both launches (fused where short)
    for ctr in (None, counters):
        out = torch.full_like(q, 7.0)
        groups = ((0, n_long, bucket, long_splits), (n_long, len(lens), 16, short_splits))
        for a, b, max_q, splits in groups:
            tri.extend.extend_attention_triton(
                q, case.k_cache, case.v_cache, case.block_tables[a:b], cu[a : b + 1], case.seq_lens[a:b], 0.25,
                max_q_len=max_q, out=out, num_splits=splits, config=config, counters=ctr,
            )  # fmt: skip
        assert rel_err(out[:real], oracle(q, case, long_q + short_q, 0.25)[:real]) < 1e-4
        assert out[real:].eq(7.0).all()
        assert counters.eq(0).all()


class _SpyKernel:
    """Wraps the forward kernel: records each launch's grid and constexprs, then runs it."""

    def __init__(self, real) -> None:
        self.real, self.launches = real, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, kwargs))
            return self.real[grid](*args, **kwargs)

        return launch


def _dynamic_split_setup(tri, monkeypatch, lens: list[int], *, seed: int):
    """A 2-KV-head case of `lens`, small tiles, counters, a grid of at most 4 dynamic splits, no reduce kernel
    allowed, and a spy on the forward kernel's launches."""
    case = make_case(lens, 2, 16, 4, seed=seed)
    counters = split_counters(len(lens) * 8, 2, "cpu")
    monkeypatch.setattr(tri.common, "split_reduce_kernel", _NoReduce())
    spy = _SpyKernel(tri.common.paged_attention_fwd_kernel)
    monkeypatch.setattr(tri.common, "paged_attention_fwd_kernel", spy)
    monkeypatch.setattr(tri.common, "EXTEND_MAX_DYN_SPLITS", 4)
    monkeypatch.setattr(tri.extend, "EXTEND_MAX_DYN_SPLITS", 4)
    return case, tri.common.KernelConfig(**SMALL), counters, spy


def test_triton_extend_dynamic_splits(tri, monkeypatch) -> None:
    """`split_keys`: one grid sized for the block table's width, each query block using one split per `split_keys`
    keys it sees (capped by the grid): rows of 1, 2, 3 and (capped) 4 splits beside a padding row, all against the
    float64 oracle, the merge in the kernel (no reduce launch), counters back to zero for a second launch, the
    bucket's padding tokens untouched. A block left with one split writes out directly: bit-identical to a
    one-split launch."""
    q_lens, lens = [2, 3, 0, 1, 2], [15, 40, 1, 70, 200]  # 16-key splits: 1, 3, -, 5 -> capped 4, 13 -> 4
    case, cfg, counters, spy = _dynamic_split_setup(tri, monkeypatch, lens, seed=41)
    gen = torch.Generator().manual_seed(42)
    real = sum(q_lens)
    for _ in range(2):
        q = torch.randn(real + 3, 4, 16, generator=gen)  # 3 padding tokens past the rows
        args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
        out = torch.full_like(q, 7.0)
        tri.extend.extend_attention_triton(*args, max_q_len=4, out=out, config=cfg, counters=counters, split_keys=16)
        grid, kw = spy.launches[-1]
        assert kw["DYN_SPLITS"] and kw["FUSED_REDUCE"] and grid[2] == 4  # width 200 keys / 16 -> 13, capped at 4
        assert rel_err(out[:real], oracle(q, case, q_lens, 0.25)[:real]) < 1e-4
        assert out[real:].eq(7.0).all() and counters.eq(0).all()
        single = tri.extend.extend_attention_triton(*args, max_q_len=4, out=torch.full_like(q, 7.0), num_splits=1,
                                                    config=cfg)  # fmt: skip
        assert torch.equal(out[:2], single[:2])  # the 15-key row: one split, written directly


def test_triton_extend_dynamic_splits_capped_by_busy_programs(tri, monkeypatch) -> None:
    """`split_programs`: at most max(1, split_programs // (busy query blocks x KV heads)) splits, the busy blocks
    counted on the device. Four busy rows of one query block each and 2 KV heads make 8 programs a split: a cap of
    7 leaves one split everywhere (bit-identical to a one-split launch), 16 at most two, 10**6 none (bit-identical
    to no cap); each against the float64 oracle, counters back to zero."""
    q_lens, lens = [2, 3, 0, 1, 2], [15, 40, 1, 70, 200]  # 16-key splits: 1, 3, -, 5 -> 4, 13 -> 4
    case, cfg, counters, spy = _dynamic_split_setup(tri, monkeypatch, lens, seed=47)
    real = sum(q_lens)
    q = torch.randn(real + 2, 4, 16, generator=torch.Generator().manual_seed(48))
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
    ref = oracle(q, case, q_lens, 0.25)[:real]
    outs = {}
    for cap in (0, 7, 16, 10**6):
        out = torch.full_like(q, 7.0)
        tri.extend.extend_attention_triton(*args, max_q_len=4, out=out, config=cfg, counters=counters, split_keys=16,
                                           split_programs=cap)  # fmt: skip
        grid, kw = spy.launches[-1]
        assert kw["DYN_SPLITS"] and grid[2] == 4 and (kw["ROWS_P2"] == 8) == (cap > 0)
        assert rel_err(out[:real], ref) < 1e-4 and out[real:].eq(7.0).all() and counters.eq(0).all()
        outs[cap] = out
    single = tri.extend.extend_attention_triton(*args, max_q_len=4, out=torch.full_like(q, 7.0), num_splits=1,
                                                config=cfg)  # fmt: skip
    assert torch.equal(outs[7], single)
    assert torch.equal(outs[10**6], outs[0])
    assert not torch.equal(outs[16], single) and not torch.equal(outs[16], outs[0])  # two splits: neither of them
    with pytest.raises(ValueError, match="split_programs"):
        tri.extend.extend_attention_triton(*args, out=nan_like(q), split_programs=-1)


def test_triton_extend_one_block_a_row(tri, monkeypatch) -> None:
    """`extend_config(128)` at GQA 8: a row of up to 16 tokens is one query block (the grid's second axis is the KV
    heads alone, so each row's keys are read once), its dynamic splits merged in the kernel. Rows of 16, 10, 9 and 1
    tokens (one and two of the default 8-token blocks) against the float64 oracle and against the default tiles;
    padding untouched, counters back to zero."""
    q_lens, lens = [16, 10, 0, 9, 1], [16, 75, 1, 44, 130]  # 32-key splits: 1, 3, -, 2, 5 -> capped 4
    case = make_case(lens, 1, 16, 4, seed=45)
    small = {"block_n": 16}  # several key tiles a split
    cfg = replace(tri.common.extend_config(128), **small)
    assert (cfg.block_m, cfg.num_warps) == (128, 8)
    counters = split_counters(len(lens) * 2, 1, "cpu")
    monkeypatch.setattr(tri.common, "split_reduce_kernel", _NoReduce())
    spy = _SpyKernel(tri.common.paged_attention_fwd_kernel)
    monkeypatch.setattr(tri.common, "paged_attention_fwd_kernel", spy)
    monkeypatch.setattr(tri.extend, "EXTEND_MAX_DYN_SPLITS", 4)
    gen = torch.Generator().manual_seed(46)
    real = sum(q_lens)
    q = torch.randn(real + 2, 8, 16, generator=gen)
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
    outs = {}
    for name, c in (("one", cfg), ("default", replace(tri.common.EXTEND_CONFIG, **small))):
        out = torch.full_like(q, 7.0)
        tri.extend.extend_attention_triton(*args, max_q_len=16, out=out, config=c, counters=counters, split_keys=32)
        grid, kw = spy.launches[-1]
        assert kw["DYN_SPLITS"] and kw["FUSED_REDUCE"]
        assert (kw["BLOCK_Q"], grid[1]) == ((16, 1) if name == "one" else (8, 2))
        assert rel_err(out[:real], oracle(q, case, q_lens, 0.25)[:real]) < 1e-4
        assert out[real:].eq(7.0).all() and counters.eq(0).all()
        outs[name] = out
    assert rel_err(outs["one"][:real], outs["default"][:real]) < 1e-4


def test_triton_extend_dynamic_splits_need_the_fused_merge(tri, monkeypatch) -> None:
    """Without counters (or with query blocks too long to merge in the kernel) `split_keys` is ignored: the shape
    rule's split count, the reduce kernel, the same result."""
    q_lens, lens = [2, 1], [40, 90]
    case = make_case(lens, 2, 16, 4, seed=43)
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(44))
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, 0.25)
    spy = _SpyKernel(tri.common.paged_attention_fwd_kernel)
    monkeypatch.setattr(tri.common, "paged_attention_fwd_kernel", spy)
    out = tri.extend.extend_attention_triton(*args, out=nan_like(q), config=tri.common.KernelConfig(**SMALL),
                                             split_keys=16)  # fmt: skip
    assert not spy.launches[-1][1]["DYN_SPLITS"]
    assert rel_err(out, oracle(q, case, q_lens, 0.25)) < 1e-4
    with pytest.raises(ValueError, match="split_keys"):
        tri.extend.extend_attention_triton(*args, out=nan_like(q), split_keys=-1)


@pytest.fixture
def reversed_grid():
    """Programs run in reverse grid order (the interpreter otherwise runs rows in ascending order, so a row would
    find the keys of a request's earlier rows already written by their own programs; a GPU runs them in any
    order)."""
    import triton.runtime.interpreter as interpreter

    builder = type(interpreter.interpreter_builder)
    if not hasattr(builder, "set_grid_idx"):
        pytest.skip("this Triton's interpreter sets no grid index to reorder")
    real = builder.set_grid_idx

    def backwards(self, x, y, z):
        nx, ny, nz = self.grid_dim
        real(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = backwards
    yield
    builder.set_grid_idx = real


@pytest.fixture
def bf16_dot():
    """`tl.dot` of bf16 operands as a GPU computes it (exact products, float32 sums): the interpreter keeps bf16 as
    uint16 bits and would multiply those integers."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    builder = type(interpreter.interpreter_builder)
    if not hasattr(builder, "create_dot") or not hasattr(interpreter, "TensorHandle"):
        pytest.skip("this Triton's interpreter has no dot builder to widen")
    real = builder.create_dot

    def widened(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return real(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    yield
    builder.create_dot = real


# A request's 3 new tokens at positions 62-64 (as a graph lays out a 3-token row: three decode rows sharing its row
# slot), a 1-token row, a 2-token row and two padding rows. With 2 splits of 64-key tiles the 65-key row splits at
# key 64: its first split reads keys 62 and 63, the new keys of the two rows before it.
ROPE_REQUESTS = [(62, 3), (20, 1), (5, 2)]


@pytest.mark.parametrize(
    ("dtype", "qk_norm", "num_heads", "num_kv_heads", "head_dim", "num_splits", "config", "fused_merge"),
    [
        (torch.bfloat16, True, 4, 2, 16, 2, "decode", True),  # the split at key 64; 4 warps: norms 4 heads a chunk
        (torch.bfloat16, False, 4, 2, 16, 2, "decode", False),  # no q/k norm; the reduce kernel merges
        (torch.bfloat16, True, 8, 2, 32, 3, "small", True),  # GQA 4; 32-key splits: 62-63 | 64 again
        (torch.float32, True, 6, 2, 16, 2, "short", True),  # GQA 3 in 2-warp chunks of 2 heads (one half empty)
        (torch.float32, False, 4, 1, 16, 1, "short", False),  # one KV head, one split
        (torch.bfloat16, True, 16, 8, 32, 2, "short", True),  # Qwen3-0.6B's heads (16 / 8), 2 warps
    ],
)
def test_fused_rope_decode_is_bit_identical(tri, reversed_grid, bf16_dot, dtype, qk_norm, num_heads, num_kv_heads,
                                            head_dim, num_splits, config, fused_merge) -> None:  # fmt: skip
    """`decode_attention_fused_rope_triton` (q/k norm, RoPE and the K/V write inside the decode kernel) against
    `qk_norm_rope_store` + `decode_attention_triton`: output and both caches bit-identical, programs run in reverse
    order so that each row must write the earlier new keys its splits read itself."""
    from attention_cases import fused_rope_vs_unfused, rope_step

    cfg = {"decode": tri.common.DECODE_CONFIG, "short": tri.common.SHORT_DECODE_CONFIG,
           "small": tri.common.KernelConfig(block_n=16)}[config]  # fmt: skip
    step = rope_step(ROPE_REQUESTS, num_heads, num_kv_heads, head_dim, 4, dtype=dtype, qk_norm=qk_norm, seed=51,
                     padding=2)  # fmt: skip
    if num_splits == 2 and config == "decode":  # the case the walk-back exists for: keys 62-63 | 64
        assert math.ceil(math.ceil(65 / 2) / cfg.block_n) * cfg.block_n == 64  # the kernel's split length
    counters = split_counters(len(step.seq_lens), num_kv_heads, "cpu") if fused_merge else None
    for _ in range(2):  # counters back at zero for a second launch (a graph replay)
        assert fused_rope_vs_unfused(step, max_row_tokens=8, num_splits=num_splits, config=cfg,
                                     counters=counters) == []  # fmt: skip
        assert counters is None or counters.eq(0).all()


def test_fused_rope_decode_needs_the_walk_back(tri, reversed_grid, bf16_dot) -> None:
    """Without the walk back over a request's earlier rows (`max_row_tokens=1`: each row writes only its own new
    token), the 65-key row's first split reads keys 62-63 before their rows' programs write them (NaN in the
    cache): the output differs. Guards the bit-identity test above against a walk that does nothing."""
    from attention_cases import fused_rope_vs_unfused, rope_step

    step = rope_step(ROPE_REQUESTS, 4, 2, 16, 4, dtype=torch.bfloat16, qk_norm=True, seed=52)
    launch = {"num_splits": 2, "config": tri.common.DECODE_CONFIG}
    assert fused_rope_vs_unfused(step, max_row_tokens=8, **launch) == []
    assert fused_rope_vs_unfused(step, max_row_tokens=1, **launch) == ["out"]  # the caches are complete either way


def test_fused_rope_decode_without_row_slots(tri, bf16_dot) -> None:
    """Rows with page-table rows of their own (no row slots): one new token a row, bit-identical as well."""
    from attention_cases import fused_rope_vs_unfused, rope_step

    step = rope_step([(30, 1), (9, 1), (0, 1)], 4, 2, 16, 4, dtype=torch.bfloat16, qk_norm=True, seed=53)
    assert fused_rope_vs_unfused(step, max_row_tokens=1, row_slots=False, num_splits=3,
                                 config=tri.common.KernelConfig(block_n=16)) == []  # fmt: skip


def test_fused_rope_decode_rejects_what_it_cannot_fuse(tri) -> None:
    from tokenrouter.engine.attention import fused_rope_applies
    from tokenrouter.engine.attention.triton_common import RopeStore

    assert fused_rope_applies("triton", torch.device("cpu"), 128)
    assert not fused_rope_applies("triton", torch.device("cpu"), 96)
    assert not fused_rope_applies("torch", torch.device("cpu"), 128)
    cache = torch.zeros(3, 4, 2, 12)
    table, seq = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32)
    rope = RopeStore(zero, torch.zeros(8, 12), None, 1e-6, zero)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        tri.decode.decode_attention_fused_rope_triton(torch.zeros(1, 8 * 12), rope, cache, cache.clone(), table, seq,
                                                      1.0, 4)  # fmt: skip
    cache = torch.zeros(3, 4, 2, 16)
    rope = RopeStore(zero, torch.zeros(8, 16), None, 1e-6, zero)
    with pytest.raises(ValueError, match="qkv must be"):
        tri.decode.decode_attention_fused_rope_triton(torch.zeros(1, 7 * 16), rope, cache, cache.clone(), table, seq,
                                                      1.0, 4)  # fmt: skip
