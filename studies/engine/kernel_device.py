"""Where a kernel study runs: the GPU in bf16, or Triton's CPU interpreter in fp32 for `--smoke` (shared by the
kernel studies here: extend_tiles.py, wide_gemm.py, rope_heads.py)."""

from __future__ import annotations

import os
import sys

import torch


def kernel_device(smoke: bool) -> tuple[bool, torch.device, torch.dtype] | None:
    """(cuda, device, dtype): the GPU unless `smoke` or there is none; without one the interpreter must be on
    (TRITON_INTERPRET=1, chosen before Triton is imported), else a message on stderr and None (exit 2)."""
    cuda = torch.cuda.is_available() and not smoke
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        print("without a GPU, run with TRITON_INTERPRET=1 --smoke", file=sys.stderr)
        return None
    return cuda, torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
