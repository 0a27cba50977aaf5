"""Paged attention: torch reference vs an independent float64 oracle, Triton kernels (CPU interpreter) vs the
reference, store_kv, and an ahead-of-time sm_90 compile of the kernels (catches GPU-only compile errors and
register spills without a GPU).

Caches are poisoned with NaN everywhere a real token was not written (including the null page 0 that
unused block-table entries point at) and outputs are NaN-filled before each kernel, so any read of a
foreign slot or any unwritten output element shows up as NaN.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from tokenrouter.engine.attention import (
    decode_attention,
    extend_attention,
    resolve_backend,
    split_counters,
    store_kv,
)
from tokenrouter.engine.triton_compat import squeeze_index

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


# ----------------------------------------------------------------------------------------------- fixtures


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


# ------------------------------------------------------------------------------------- torch reference


def test_store_kv_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.zeros(5, 4, 2, 8)
    v_cache = torch.zeros(5, 4, 2, 8)
    k = torch.randn(6, 2, 8, generator=gen)
    v = torch.randn(6, 2, 8, generator=gen)
    slots = torch.tensor([4, 5, 6, 13, 19, 8], dtype=torch.int32)  # int32 accepted, pages 1, 2, 3, 4
    store_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(20, 2, 8), v_cache.view(20, 2, 8)
    assert torch.equal(flat_k[slots.long()], k) and torch.equal(flat_v[slots.long()], v)
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slots.long()] = False
    assert flat_k[untouched].eq(0).all() and flat_v[untouched].eq(0).all()
    with pytest.raises(ValueError):
        store_kv(k, v, k_cache, v_cache, slots[:3])


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (6, 2, 32), (4, 4, 16)])
def test_reference_decode_matches_oracle(page_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    lens = [1, 5, 17, 40]  # 1 token, inside one page, crossing page boundaries
    case = make_case(lens, num_kv_heads, head_dim, page_size, seed=1)
    q = torch.randn(len(lens), num_heads, head_dim, generator=torch.Generator().manual_seed(2))
    scale = head_dim**-0.5
    out = decode_attention(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale, backend="torch")
    assert rel_err(out, oracle(q, case, [1] * len(lens), scale)) < 1e-5


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (6, 2, 32)])
def test_reference_extend_matches_oracle(page_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    # prefill (prefix 0), extend after a long prefix, a decode row, an idle row (0 new tokens), a short extend.
    q_lens = [9, 3, 1, 0, 6]
    lens = [9, 33, 13, 7, 21]
    case = make_case(lens, num_kv_heads, head_dim, page_size, seed=3)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(4))
    scale = head_dim**-0.5
    out = extend_attention(
        q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens), case.seq_lens, scale, backend="torch"
    )
    assert rel_err(out, oracle(q, case, q_lens, scale)) < 1e-5


def test_auto_backend_is_torch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError):
        resolve_backend("cuda", torch.device("cpu"))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ Triton, CPU interpreter


@pytest.fixture(scope="module")
def tri():
    """The Triton attention modules, decorated in interpreter mode; env and patch are undone afterwards so
    other test modules' "auto" backends still pick torch on CPU. (Triton 3.6's interpreter itself leaves
    `triton.language` patched once a kernel calls a nested @triton.jit helper, so real compilation must
    happen in another process: see the sm_90 test.)"""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        import triton.runtime.interpreter as interpreter

        if hasattr(interpreter, "_patch_lang_tensor"):
            mp.setattr(interpreter, "_patch_lang_tensor", squeeze_index(interpreter._patch_lang_tensor))
        from tokenrouter.engine.attention import triton_common, triton_decode, triton_extend, triton_kernels

        if not isinstance(triton_kernels.paged_attention_fwd_kernel, interpreter.InterpretedFunction):
            pytest.skip("Triton kernels were imported earlier without TRITON_INTERPRET=1")
        yield SimpleNamespace(common=triton_common, decode=triton_decode, extend=triton_extend)


SMALL = {"block_n": 16, "block_m": 16}  # several KV tiles and query blocks even on ~40-token rows


@needs_triton
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


@needs_triton
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


@needs_triton
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


@needs_triton
def test_merge_chunk_sizes(tri) -> None:
    chunk = tri.common.merge_chunk
    cfg = tri.common.DECODE_CONFIG
    assert chunk(33, 4, 128, cfg) == 16  # Qwen3-8B: 4 heads x 16 splits x 128 dims = 8192 fp32
    assert chunk(33, 2, 128, cfg) == 32 and chunk(33, 8, 128, cfg) == 8
    assert chunk(3, 2, 128, cfg) == 4  # never more than the (padded) split count
    assert chunk(9, 16, 256, cfg) == 2 and chunk(9, 64, 256, cfg) == 1


@needs_triton
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


@needs_triton
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


@needs_triton
def test_triton_zero_length_rows_give_zeros(tri) -> None:
    """A padded CUDA-graph row may carry seq_len 0: its output must be finite (zeros), never NaN."""
    case = make_case([6, 0], 2, 16, 4, seed=9)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(10))
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25)
    ref = decode_attention(*args, backend="torch")
    for splits in (1, 2):
        out = tri.decode.decode_attention_triton(*args, out=nan_like(q), num_splits=splits)
        assert out[1].eq(0).all() and rel_err(out, ref) < 1e-4


@needs_triton
def test_split_heuristic_values(tri) -> None:
    choose = tri.common.choose_num_splits
    assert choose(8, 128, 132) == 1  # short context: never split
    assert choose(8, 8192, 132) == 32  # batch 1 x 8 KV heads at 8k: capped by 256 tokens per split
    assert choose(256, 8192, 132) == 3  # big batch: little splitting
    assert all(choose(p, 8192, 132) >= choose(2 * p, 8192, 132) for p in (8, 32, 128, 512))


# ----------------------------------------------------------------------------- ahead-of-time GPU compile


@needs_triton
def test_kernels_compile_for_sm90_without_spills() -> None:
    """Lower the bf16 Qwen3-shaped kernels to sm_90 with Triton's bundled ptxas: catches GPU-only compile
    errors, register spills and lost pipelining on a CPU machine. A subprocess, because the interpreter
    runs above leave `triton.language` patched in this process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tokenrouter.engine.attention.aot_check", "--quick"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    if proc.returncode == 2:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
