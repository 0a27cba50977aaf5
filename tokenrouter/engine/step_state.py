"""`StepState`: what `forward.StepForward` and `warmup` read from `runner.Engine`, at every pass (the engine
replaces buffers, router and PDL while it lives). A protocol: naming `Engine` would close an import cycle."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from tokenrouter.core.router import DeviceRouter
    from tokenrouter.engine.config import EngineConfig
    from tokenrouter.engine.kv_cache import KVCache
    from tokenrouter.engine.model import CausalLM
    from tokenrouter.engine.page_table import PageTable
    from tokenrouter.engine.parallel import TensorParallel
    from tokenrouter.engine.varlen_shapes import VarlenShapes
    from tokenrouter.models.spec import ModelSpec


class StepState(Protocol):
    config: EngineConfig
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    model: CausalLM
    tp: TensorParallel  # this engine's rank in its tensor-parallel group (one rank: no collectives)
    use_triton_ops: bool  # the Triton kernels for norms, RoPE/KV store, prologue and sampling
    pdl: bool  # programmatic dependent launch for the Triton kernels
    router: DeviceRouter | None  # a router's device part, run inside every step
    # Buffers sized for the current KV pool:
    kv_cache: KVCache
    table: PageTable  # device page tables
    slot_tokens: torch.Tensor  # [slots] int32: the last token sampled into each page-table slot (from_prev)
    out_ids: torch.Tensor  # [2 * out_width] int32: tokens, then destinations, of one step
    out_width: int
    eager_out_base: int  # output index of the eager part's first logit row
    split_counters: torch.Tensor | None  # fused split-KV reduce (Triton attention)
    varlen_shapes: VarlenShapes | None  # padded shapes of the varlen graphs (None: no varlen graphs)

    @property
    def max_context_len(self) -> int: ...

    def synchronize(self) -> None:
        """Wait for every launch of the engine's device (no-op on CPU)."""

    def on_stream(self) -> AbstractContextManager[Any]:
        """Run the enclosed device work on the engine's stream."""
