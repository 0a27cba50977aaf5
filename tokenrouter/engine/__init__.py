"""The torch model executor: `Engine` (our `ModelRunner`), its config and errors (exports resolved lazily)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {"Engine": "tokenrouter.engine.runner", "EngineConfig": "tokenrouter.engine.config",
            "ModelRunner": "tokenrouter.engine.base", "ModelLoadError": "tokenrouter.engine.errors",
            "BatchError": "tokenrouter.engine.errors"}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenrouter.engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
