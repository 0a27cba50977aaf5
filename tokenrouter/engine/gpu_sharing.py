"""Co-location of one engine (docs/engine.md, Start-up and memory): its CUDA stream (priority, or a green context's
SMs) and a check of the MPS share the launcher sets (`EngineConfig.mps_environment()`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


def make_stream(device: torch.device, priority: int = 0, green_sms: int | None = None) -> tuple[Any, Any]:
    """(stream, green context or None) for an engine on `device`; (None, None) on CPU."""
    if device.type != "cuda":
        return None, None
    if green_sms is None:
        return torch.cuda.Stream(device, priority=priority), None
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError as e:
        raise RuntimeError("green_context_sms needs torch.cuda.green_contexts (torch >= 2.11)") from e
    gc = GreenContext.create(green_sms, device.index or 0)
    gc.set_context()
    try:
        stream = gc.Stream()
    finally:
        gc.pop_context()
    return stream, gc


def check_mps(percentage: int | None) -> None:
    """Warn when the configured MPS share is not what this process's environment says."""
    have = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if percentage is not None and have != str(percentage):
        log.warning("mps_active_thread_percentage=%s but CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%r in this process: "
                    "the launcher must set it (EngineConfig.mps_environment()) before CUDA starts",
                    percentage, have)  # fmt: skip
