"""Work-arounds for Triton's CPU interpreter (TRITON_INTERPRET=1: tests, the studies' --smoke modes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def squeeze_index(original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """Wrap the interpreter's `_patch_lang_tensor` so size-1 tensors convert with `__index__` again (Triton 3.6 calls
    int() on 1-D size-1 arrays, which numpy >= 2.4 rejects, breaking runtime-bound `range()`: triton#9171)."""

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    return patched


def patch_interpreter_for_numpy24() -> None:
    """Apply `squeeze_index` for the rest of this process (one-shot scripts and test subprocesses)."""
    import triton.runtime.interpreter as interpreter

    if hasattr(interpreter, "_patch_lang_tensor"):
        interpreter._patch_lang_tensor = squeeze_index(interpreter._patch_lang_tensor)
