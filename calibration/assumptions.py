"""`Assumptions`: every number the analytic profile assumes or took from a measurement; apart from `analytic.py` so
the cost model does not import it (runpy warns when `python -m` runs a module already imported)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Assumptions:
    """Times in ms unless named _us."""

    graph_launch_ms: float = 0.015  # measured: replay + sync of a one-kernel graph, 14 us
    kernel_us: float = 2.1  # measured: device time of a tiny kernel inside a graph
    # Non-GEMM kernels per decoder layer. The bundled profile assumes the fused engine we target (norm,
    # qk-norm+rope, kv store, attention, act, add+norm); an unfused plain-torch stack runs about 57
    # (4 RMSNorms x 8, RoPE 16, KV store 3, attention 2, SiLU*mul 2, 2 adds): `--small-kernels-per-layer 57`.
    small_kernels_per_layer: int = 6
    gemms_per_layer: int = 4  # qkv, o, gate_up, down
    kernels_fixed: int = 15  # embedding, final RMSNorm, LM head, sampling
    eager_op_us: float = 9.9  # measured: host time of one PyTorch op (dispatch + launch)
    eager_fixed_ms: float = 0.05  # the GPU idles until the first eager kernel arrives
    elementwise_bytes: float = 4.0  # traffic per hidden element per non-GEMM kernel (bf16 read + write)
    kv_read_eff: float = 1.0  # measured: decode attention read KV at ~4.6 TB/s (above the 4,255 copy figure)
    row_fixed_ms: float = 0.001  # per-row sampling and metadata beyond the LM-head row
    ext_ref_ctx: int = 2048  # mean keys attended by a prefill token (mid-point of a 4k prompt)
    allreduce_ms: float = 0.01  # one small NVLink all-reduce (tp > 1 only)
    router_ms: float = 0.02  # router MLP/entropy per step, captured in the graph
    sched_ms: float = 0.3  # host time per step (scheduling, post-processing): hidden behind the GPU with overlap
    ipc_ms: float = 0.05  # one ZeroMQ ipc:// message on one host
    link_latency_ms: float = 0.1  # one-way TCP latency between hosts incl. ZeroMQ
    link_bandwidth_gbps: float = 100.0  # Gbit/s NIC
    mps_default_slowdown: float = 1.25  # step slowdown while a co-located model streams weights too
    kv_budget_gb: float = 24.0  # per model: 0.6B+32B weights (65 GB) + 2 x 24 GB fit a 141 GB H200
    std_ref_model: str = "qwen3-0.6b"
    std_ref_small_kernels_per_layer: int = 6  # fused: norm, qk-norm+rope, kv store, attention, act, add+norm
    std_infer_fraction: float = 0.042  # paper: small-model inference share of a standard-serving step
    std_ref_batch: int = 8  # paper's concurrency
    std_ref_ctx: int = 1024  # prefix per row at 2,048 max output tokens (~100 prompt + half the output)
    std_long_ctx: int = 4096  # same at 8,192 max output tokens
    std_long_loss: float = 0.58  # paper: std serving loses 58-85% of its throughput there; low end used
