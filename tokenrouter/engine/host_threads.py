"""Intra-op CPU threads of an engine's process (process-wide in torch, so set once at a process's entry, never by
an engine: two engines may share a process)."""

from __future__ import annotations

import torch


def set_intra_op_threads(n: int) -> None:
    """Torch's intra-op thread pool of this process: `n` threads (>= 1)."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
