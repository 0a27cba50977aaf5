"""`cuda_only`: a test that needs a CUDA device. It skips without one and carries the `gpu` marker, so the GPU
machine runs exactly these with `python -m pytest -m gpu` (a few minutes) and CI, without a GPU, skips them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch


def cuda_only(reason: str = "needs a CUDA device") -> Callable[[Any], Any]:
    def mark(test: Any) -> Any:
        return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)(test))

    return mark
