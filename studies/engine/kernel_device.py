"""What the kernel studies here share (extend_tiles.py, wide_gemm.py, rope_heads.py): their common arguments, where
they run (the GPU in bf16, or Triton's CPU interpreter in fp32 for `--smoke`), and the exit status from bad rows."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch


def kernel_device(smoke: bool) -> tuple[bool, torch.device, torch.dtype] | None:
    """(cuda, device, dtype): the GPU unless `smoke` or there is none; without one the interpreter must be on
    (TRITON_INTERPRET=1, chosen before Triton is imported), else a message on stderr and None (exit 2)."""
    cuda = torch.cuda.is_available() and not smoke
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        print("without a GPU, run with TRITON_INTERPRET=1 --smoke", file=sys.stderr)
        return None
    return cuda, torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32


def kernel_setup(
    p: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, tuple[bool, torch.device, torch.dtype]] | None:
    """(args, (cuda, device, dtype)) from `p` (built on `kernel_args`) and `kernel_device`; None: nowhere to run
    (the caller exits 2)."""
    args = p.parse_args(argv)
    where = kernel_device(args.smoke)
    return None if where is None else (args, where)


def kernel_args(doc: str, budget: float) -> argparse.ArgumentParser:
    """A study's parser with `--out`, `--smoke` and `--budget` (seconds; later cases are skipped)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--smoke", action="store_true", help="tiny shapes in the CPU interpreter (TRITON_INTERPRET=1)")
    p.add_argument("--budget", type=float, default=budget, help="seconds; later cases are skipped")
    return p


def exit_status(rows: list[dict[str, Any]], tol: float = 2e-2) -> int:
    """1 (after printing up to five) if a row failed (`error`) or missed the reference by more than `tol`, else 0."""
    bad = [r for r in rows if "error" in r or r.get("err", 0) > tol]
    for r in bad[:5]:
        print("  BAD", json.dumps(r)[:300])
    return 1 if bad else 0
