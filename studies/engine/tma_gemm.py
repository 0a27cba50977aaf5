"""A tensor-core GEMM whose tiles arrive by TMA (Hopper's tensor memory accelerator), for `wide_gemm.py` (issue 30).

y[M, N] = x[M, K] @ W[N, K]^T for the 17-256-token passes where cuBLAS streams the 32B's weights at 3.4-3.6 TB/s and
the skinny GEMM's pointer loads fall behind it (`results/2026-12-04-h200-wide-gemm`). Same shape as the skinny
GEMM's tensor-core path (a program owns BLOCK_N weight rows x all token rows, weights as the MMA's M side, split-K
with the last arrival summing the partials in split order: the engine's `store_tile`), but both operands come
through host-built tensor descriptors: out-of-range rows and columns read as zeros (no masks, no clamped
addresses) and the pipeline's loads are TMA copies instead of per-thread cp.async. A study kernel: the engine does
not use it unless it wins.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tokenrouter.engine.triton_gemv import store_tile


@triton.jit
def tma_gemm_kernel(
    x_desc, w_desc, Y, Part, Counters, M, N, K_SPLIT, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(N, BLOCK_N), split_k): y[:M, n-tile] over the K slice [pid_k * K_SPLIT, + K_SPLIT). SPLIT: Part is
    fp32 [split_k, M, N] and Counters int32 (one zero entry per n-tile, zero again on exit)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    k_lo = pid_k * K_SPLIT
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(0, K_SPLIT, BLOCK_K):
        w = w_desc.load([n0, k_lo + k])
        x = x_desc.load([0, k_lo + k])
        acc = tl.dot(w, tl.trans(x), acc)
    store_tile(tl.trans(acc), Y, Part, Counters, Y, pid_n, pid_k, tl.arange(0, BLOCK_M), n0 + tl.arange(0, BLOCK_N),
               M, N, stride_ym, SPLIT, False)  # fmt: skip


def tma_gemm(x: torch.Tensor, weight: torch.Tensor, *, block_n: int, block_k: int, split_k: int, num_warps: int,
             num_stages: int, counters: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """out = x @ weight.T (x [M, K], M <= 256; weight [N, K]); K must split into split_k whole slices of block_k."""
    m, k = x.shape
    n = weight.shape[0]
    if k % (split_k * block_k):
        raise ValueError(f"K = {k} does not split into {split_k} slices of whole {block_k}-column tiles")
    bm = max(16, triton.next_power_of_2(m))
    x_desc = TensorDescriptor.from_tensor(x, [bm, block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    tiles = triton.cdiv(n, block_n)
    part = torch.empty(split_k, m, n, device=x.device, dtype=torch.float32) if split_k > 1 else out
    tma_gemm_kernel[(tiles, split_k)](
        x_desc, w_desc, out, part, counters, m, n, k // split_k, out.stride(0),
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split_k > 1, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
