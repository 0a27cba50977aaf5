"""Count the device kernels one engine step launches, per decoder layer, on any device (CPU included): torch ops
that launch a kernel on CUDA (via a dispatch mode) and Triton launches (by wrapping the launchers), attributed to
the decoder layer running or to "step". `count_graph_body_launches(engine, batch).per_layer()`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that only allocate, alias or read metadata: no kernel launch on CUDA.
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias",
              "_local_scalar_dense", "record_stream", "set_", "resize_", "sym_size", "sym_stride", "sym_numel",
              "sym_storage_offset", "is_same_size"}  # fmt: skip


def launches_kernel(func: Any) -> bool:
    """True for an aten op that runs a device kernel (not a view, allocation or metadata query)."""
    if getattr(func, "is_view", False):
        return False
    return func.overloadpacket.__name__ not in _NO_KERNEL


class _Mode(TorchDispatchMode):
    def __init__(self, counter: LaunchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.counter._in_triton and launches_kernel(func):
            self.counter._record(f"torch.{func.overloadpacket.__name__}")
        return out


class LaunchCounter:
    """Context manager recording every kernel launch of the model's forward (see the module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.events: list[tuple[str, str]] = []  # (section, kernel name) in launch order
        self._section = "step"
        self._in_triton = False
        self._hooks: list[Any] = []
        self._patched: list[tuple[Any, str, Any]] = []
        self._mode = _Mode(self)

    # ---- results ------------------------------------------------------------------------------------------
    @property
    def sections(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for section, name in self.events:
            out.setdefault(section, []).append(name)
        return out

    def per_layer(self) -> list[int]:
        layers = getattr(self.model, "layers", [])
        s = self.sections
        return [len(s.get(f"layer{i}", [])) for i in range(len(layers))]

    def layer_kernels(self, i: int) -> list[str]:
        return self.sections.get(f"layer{i}", [])

    # ---- recording ----------------------------------------------------------------------------------------
    def _record(self, name: str) -> None:
        self.events.append((self._section, name))

    def _wrap_triton(self, cls: Any) -> None:
        original = cls.run
        counter = self

        def run(self_fn, *args, **kwargs):
            if counter._in_triton:
                return original(self_fn, *args, **kwargs)
            fn = getattr(self_fn, "fn", None)
            counter._record(f"triton.{getattr(fn, '__name__', type(self_fn).__name__)}")
            counter._in_triton = True
            try:
                return original(self_fn, *args, **kwargs)
            finally:
                counter._in_triton = False

        cls.run = run
        self._patched.append((cls, "run", original))

    def __enter__(self) -> LaunchCounter:
        try:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction

            self._wrap_triton(JITFunction)
            self._wrap_triton(InterpretedFunction)
        except ImportError:
            pass
        for i, layer in enumerate(getattr(self.model, "layers", [])):
            self._hooks.append(layer.register_forward_pre_hook(self._enter_layer(f"layer{i}")))
            self._hooks.append(layer.register_forward_hook(self._leave_layer))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        for cls, attr, original in reversed(self._patched):
            setattr(cls, attr, original)
        self._hooks.clear()
        self._patched.clear()

    def _enter_layer(self, name: str):
        def hook(module, args):
            self._section = name

        return hook

    def _leave_layer(self, module, args, output) -> None:
        self._section = "step"


def count_graph_body_launches(engine: Any, batch: Any) -> LaunchCounter:
    """Kernels of one graph replay for `batch`: `engine.step` loads it (uncounted), the body then runs counted."""
    graphs = engine.graphs
    bucket = engine.graph_bucket_for(batch)
    if graphs is None or bucket is None:
        raise ValueError("the engine has no graph bucket for this batch")
    engine.step(batch)
    # On the engine's stream, like a replay: the body must not overlap the step (shared buffers and counters).
    with torch.no_grad(), engine.on_stream(), LaunchCounter(engine.model) as lc:
        graphs.run_eager(bucket)
    engine.synchronize()
    return lc
