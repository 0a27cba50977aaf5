"""Engine configuration (`EngineConfig`, one per engine: nothing process-global) and the architecture facts the
modules need beyond `ModelSpec`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tokenrouter.core.graph_rule import DEFAULT_GRAPH_BUCKETS, DEFAULT_GRAPH_MAX_ROW_TOKENS, GraphRule
from tokenrouter.engine.errors import ModelLoadError
from tokenrouter.engine.varlen_shapes import default_buckets
from tokenrouter.models.spec import ModelSpec

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}  # fmt: skip


@dataclass(slots=True)
class EngineConfig:
    """Settings of one engine (docs/engine.md, Start-up and memory). KV sizing: exactly one of `kv_cache_bytes`,
    `num_pages`, `memory_budget_bytes` and `gpu_memory_utilization`, unless a `KVPool` is passed to the engine.
    `max_context_len` fixes the block-table width (default: `max_position_embeddings` or what the pool holds)."""

    model: str  # bundled spec name ("qwen3-8b", dummy weights only) or a local HF directory
    load_format: str = "auto"  # "auto": safetensors when `model` is a directory, else dummy | "safetensors" | "dummy"
    dtype: str = "auto"  # "auto": bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # "auto": cuda if available | "cpu" | "cuda" | "cuda:N"
    seed: int = 0  # dummy weights and the generator of requests without a sampling seed
    page_size: int = 16
    kv_cache_bytes: int | None = None
    num_pages: int | None = None
    max_context_len: int | None = None
    max_batch_size: int = 256  # rows per step
    attention_backend: str = "auto"  # "auto" | "triton" | "torch" (see tokenrouter.engine.attention)
    decode_num_splits: int | None = None  # split-KV factor for decode attention; None lets the kernel choose
    ops_backend: str = "auto"  # norms, q-k-norm+RoPE+KV-store, SwiGLU: "auto" = Triton on CUDA, torch on CPU
    # CUDA graphs (docs/engine.md, What runs in CUDA graphs); a failed capture is an error.
    cuda_graphs: bool = True
    graph_buckets: tuple[int, ...] = DEFAULT_GRAPH_BUCKETS
    graph_max_row_tokens: int = DEFAULT_GRAPH_MAX_ROW_TOKENS
    graph_split: bool = False  # True: a mixed step's short rows stay in a decode graph, the rest a second pass
    # Varlen graphs (`varlen_shapes`; None buckets: default_buckets up to max_num_batched_tokens).
    varlen_graphs: bool = True
    varlen_graph_buckets: tuple[int, ...] | None = None
    varlen_long_rows: int = 8
    varlen_short_q: int = 16
    varlen_max_pad_tokens: int | None = None  # None: estimated from the model's size (`max_pad_tokens`)
    graph_emulation: bool = False  # run the padded graph path eagerly where graphs cannot be captured (CPU tests)
    # Speed switches (docs/engine.md, Start-up and memory; each is timed against `BASELINE_SWITCHES`).
    decode_fused_reduce: bool = True  # split-KV decode merges its splits in the attention kernel
    # Decode (graph) steps fold the q/k-norm + RoPE + KV-write kernel into decode attention: one launch a layer fewer,
    # bit-identical (needs Triton ops and attention, a power-of-two head_dim >= 16). Off until a GPU measures it.
    decode_fused_rope: bool = False
    # Extend launches of short query blocks merge their splits in the kernel too (off until a GPU measures it faster).
    extend_fused_reduce: bool = False
    # Varlen graphs' short-row group splits each row's keys on the device, one split per this many keys (0: the
    # shape rule). Merges in the kernel (with the split counters) whatever `extend_fused_reduce` says. 1024 with the
    # cap 800: the 32B's return passes 2-17% faster at 2k-8k context, none slower (docs/engine.md, Measured choices).
    extend_split_keys: int = 1024
    # ... and at most about this many programs over the busy rows' query blocks (counted on the device; 0: no cap):
    # a few rows on long prefixes split, many rows (which fill the GPU already) do not.
    extend_split_programs: int = 800
    # Query rows (tokens x padded GQA group) of the short-row group's attention tile; 0: the extend default (64).
    # 128 at GQA 8: one block per row of up to 16 tokens, so a row's KV is read once, not by two 8-token blocks.
    extend_short_block_m: int = 0
    triton_pdl: bool = True  # programmatic dependent launch (sm_90+); capture retries without it on failure
    fuse_step_ops: bool = True  # embedding lookup and final add + gather + norm inside norm kernels
    triton_gemv: bool = True  # skinny GEMM for graph steps of up to `gemv_max_rows` tokens (needs the Triton ops)
    gemv_max_rows: int = 8  # 1..16
    # Varlen graph passes of up to this many tokens through the skinny GEMM's tensor-core tiles (`wide_config`),
    # cuBLAS above; 0: cuBLAS always. 0..256. 32: faster up to 32 tokens, slower from 48 (docs/engine.md, Measured
    # choices).
    gemv_varlen_max_rows: int = 32
    # In graph steps of one row: `GemvState.preload`, `.fold_norm` and `.lm_head`.
    gemv_preload: bool = True
    gemv_fold_norm: bool = True
    # Steps of 2 .. this many rows fold the norms too, the RMS applied after the product
    # (`GemvState.late_norm_max_rows`, not HF's rounding); 0: off until a GPU measures it faster (docs/engine.md).
    gemv_late_norm_max_rows: int = 0
    gemv_lm_head: bool = False
    argmax_chunk: int = 1024  # greedy argmax by our chunked kernel over chunks of this many logits; 0: torch's
    # Memory sizing (see the class doc); the eager pass's largest token count (the start-up profile runs it).
    memory_budget_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int = 8192
    page_table_slots: int | None = None  # one per request holding KV (LRU eviction); default 4 * max_batch_size + 1
    # Pages held by several requests (a prefix cache: `tokenrouter.baselines`; no step may write into a page
    # another live request holds). Off, a page in two requests' lists is an error.
    shared_pages: bool = False
    warmup: bool = True  # compile every kernel variant serving can hit at start-up
    # Co-location: stream priority (lower = higher), a green context of this many SMs, the launcher's MPS share.
    stream_priority: int = 0
    green_context_sms: int | None = None
    mps_active_thread_percentage: int | None = None
    # Fault injection for tests (`faults.py`).
    fail_step_ids: tuple[int, ...] = ()
    fail_captures: int = 0

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "safetensors", "dummy"):
            raise ValueError(f"load_format must be auto, safetensors or dummy, got {self.load_format!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; use auto or one of {', '.join(_DTYPES)}")
        if self.ops_backend not in ("auto", "triton", "torch"):
            raise ValueError(f"ops_backend must be auto, triton or torch, got {self.ops_backend!r}")
        minima = {"page_size": 1, "max_batch_size": 1, "graph_max_row_tokens": 1, "green_context_sms": 1,
                  "fail_captures": 0, "max_num_batched_tokens": 1}  # fmt: skip
        for name, low in minima.items():
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        sizing = [self.kv_cache_bytes, self.num_pages, self.memory_budget_bytes, self.gpu_memory_utilization]
        if sum(x is not None for x in sizing) > 1:
            raise ValueError(
                "set at most one of kv_cache_bytes, num_pages, memory_budget_bytes and gpu_memory_utilization"
            )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.mps_active_thread_percentage is not None and not 1 <= self.mps_active_thread_percentage <= 100:
            raise ValueError(f"mps_active_thread_percentage must be in 1..100, got {self.mps_active_thread_percentage}")
        if not 1 <= self.gemv_max_rows <= 16:
            raise ValueError(f"gemv_max_rows must be in 1..16, got {self.gemv_max_rows}")
        if not 0 <= self.gemv_late_norm_max_rows <= 16:
            raise ValueError(f"gemv_late_norm_max_rows must be in 0..16, got {self.gemv_late_norm_max_rows}")
        if self.extend_short_block_m not in (0, 16, 32, 64, 128):
            raise ValueError(f"extend_short_block_m must be 0, 16, 32, 64 or 128, got {self.extend_short_block_m}")
        if self.extend_split_programs < 0:
            raise ValueError(f"extend_split_programs must be >= 0 (0: no cap), got {self.extend_split_programs}")
        if self.extend_split_keys < 0:
            raise ValueError(f"extend_split_keys must be >= 0 (0: off), got {self.extend_split_keys}")
        if not 0 <= self.gemv_varlen_max_rows <= 256:
            raise ValueError(f"gemv_varlen_max_rows must be in 0..256, got {self.gemv_varlen_max_rows}")
        if self.varlen_graph_buckets is not None and any(int(b) < 1 for b in self.varlen_graph_buckets):
            raise ValueError(f"varlen graph buckets must be >= 1, got {self.varlen_graph_buckets}")
        if self.varlen_long_rows < 4 or self.varlen_long_rows % 4 or self.varlen_short_q < 1:
            raise ValueError("varlen_long_rows must be a positive multiple of 4 and varlen_short_q >= 1")
        self.graph_buckets = tuple(sorted({int(b) for b in self.graph_buckets}))
        if self.graph_buckets and self.graph_buckets[0] < 1:
            raise ValueError(f"graph buckets must be >= 1, got {self.graph_buckets}")

    def graph_rule(self, enabled: bool = True) -> GraphRule:
        """The rule the engine splits steps by (and the scheduler forms batches for)."""
        return GraphRule(enabled=enabled and bool(self.graph_buckets), buckets=self.graph_buckets or (1,),
                         max_row_tokens=self.graph_max_row_tokens, allow_split=self.graph_split)  # fmt: skip

    def varlen_buckets(self) -> tuple[int, ...]:
        if not self.varlen_graphs:
            return ()
        if self.varlen_graph_buckets is not None:
            return tuple(sorted({int(b) for b in self.varlen_graph_buckets}))
        return default_buckets(self.max_num_batched_tokens)

    def mps_environment(self) -> dict[str, str]:
        """Environment variables the launcher sets for this engine's process before CUDA starts."""
        if self.mps_active_thread_percentage is None:
            return {}
        return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.mps_active_thread_percentage)}

    def torch_device(self) -> torch.device:
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def use_triton_ops(self, device: torch.device) -> bool:
        return self.ops_backend == "triton" or (self.ops_backend == "auto" and device.type == "cuda")

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]


# Every launch-overhead switch off, cuBLAS for every projection, extend splits by the shape rule: what the studies
# time each switch against.
BASELINE_SWITCHES: dict[str, bool | int] = {"decode_fused_reduce": False, "triton_pdl": False, "fuse_step_ops": False,
                                            "triton_gemv": False, "argmax_chunk": 0,
                                            "extend_split_keys": 0}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ArchConfig:
    """Per-architecture switches (Qwen3 is the base; Qwen2 and Llama are small deltas)."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    rope_theta: float
    extra: dict[str, Any] = field(default_factory=dict)


def arch_config(spec: ModelSpec) -> ArchConfig:
    """Read the switches from the spec and its raw config; refuse features the modules do not implement."""
    raw = spec.raw or {}
    name = spec.name or spec.architecture

    def unsupported(what: str) -> ModelLoadError:
        return ModelLoadError(f"{name}: unsupported {what} for {spec.architecture}")

    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise unsupported(f"hidden_act {act!r}")
    if raw.get("mlp_bias"):
        raise unsupported("mlp_bias=true")
    if raw.get("use_sliding_window"):
        raise unsupported("sliding-window attention")
    # transformers 5 writes `rope_parameters`, 4.x `rope_theta` and `rope_scaling`; only plain RoPE is implemented.
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for params in (rope, scaling):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ("default", None):
            raise unsupported(f"rope type {kind!r}")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise unsupported("partial rotary embedding")
    theta = float(rope.get("rope_theta", raw.get("rope_theta", spec.rope_theta)))
    if spec.num_heads % spec.num_kv_heads:
        raise ModelLoadError(f"{name}: {spec.num_heads} attention heads not a multiple of {spec.num_kv_heads} kv heads")
    arch = spec.architecture
    if arch == "Qwen2ForCausalLM":  # HF Qwen2 always has q/k/v bias and no o_proj bias
        return ArchConfig(qkv_bias=True, o_bias=False, qk_norm=False, rope_theta=theta)
    bias = bool(raw.get("attention_bias", False))
    return ArchConfig(qkv_bias=bias, o_bias=bias, qk_norm=arch == "Qwen3ForCausalLM", rope_theta=theta)
