"""Model shapes shared by the engine, the cost model and the simulator (pure: no torch), the bundled tokenizers
(imported lazily: extra `serve`) and incremental detokenization for serving."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from tokenrouter.models.detokenize import IncrementalDetokenizer
from tokenrouter.models.spec import ModelSpec, bundled_model_names, load_spec

_LAZY = {"load_tokenizer", "TextTokenizer", "bundled_tokenizer_names"}

__all__ = ["IncrementalDetokenizer", "ModelSpec", "bundled_model_names", "load_spec", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module("tokenrouter.models.tokenizer"), name)
    raise AttributeError(f"module 'tokenrouter.models' has no attribute {name!r}")
