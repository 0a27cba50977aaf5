"""Paged attention: torch reference vs an independent float64 oracle, store_kv, the Triton kernels in the CPU
interpreter vs the reference (interp_attention.py, in a child process), and an ahead-of-time sm_90 compile of the
kernels (catches GPU-only compile errors and register spills without a GPU).

Caches are poisoned with NaN everywhere a real token was not written (including the null page 0 that
unused block-table entries point at) and outputs are NaN-filled before each kernel, so any read of a
foreign slot or any unwritten output element shows up as NaN.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attention_cases import cu_seqlens, make_case, oracle, rel_err

from tokenrouter.engine.attention import decode_attention, extend_attention, resolve_backend, store_kv

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
INTERP_CASES = Path(__file__).with_name("interp_attention.py")


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


@needs_triton
def test_triton_kernels_in_interpreter() -> None:
    """The Triton kernels against the reference in Triton's CPU interpreter (interp_attention.py), in a child
    pytest process: the interpreter decides per @jit at import time and leaves `triton.language` patched, so
    running it here would break every real compilation later in this process (the GPU tests)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(INTERP_CASES)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=INTERP_CASES.parent)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


# ----------------------------------------------------------------------------- ahead-of-time GPU compile


@needs_triton
def test_kernels_compile_for_sm90_without_spills() -> None:
    """Lower the bf16 Qwen3-shaped kernels to sm_90 with Triton's bundled ptxas: catches GPU-only compile
    errors, register spills and lost pipelining on a CPU machine. A subprocess, so that nothing this process
    imported decides how Triton compiles there."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tokenrouter.engine.aot_check", "--quick"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    if proc.returncode == 2:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
