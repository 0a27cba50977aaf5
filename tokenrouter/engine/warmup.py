"""Start-up work of an engine besides loading: the memory profile pass and the warmup of every kernel variant
(docs/engine.md, Start-up and memory). Everything reads the engine through `StepState`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import torch

from tokenrouter.engine.attention import resolve_backend
from tokenrouter.engine.inputs import Layout, pack
from tokenrouter.engine.memory import DeviceMemory, MemoryProfile

if TYPE_CHECKING:
    from tokenrouter.engine.config import EngineConfig
    from tokenrouter.engine.forward import StepForward
    from tokenrouter.engine.step_state import StepState

_Q_CLASSES = (1, 2, 4, 8, 16, 32, 64, 128)
_SPLITS = (1, 2, 4, 8, 16, 32, 64)


def padding_pass_inputs(rows: int, q: int, device: torch.device) -> tuple[torch.Tensor, Layout]:
    """A varlen pass of `rows` x `q` tokens on the null page and slot; rows alternate greedy and top-k/top-p."""
    t = rows * q
    layout = Layout(t, rows, rows, 0, varlen=True)
    cu = np.arange(rows + 1, dtype=np.int64) * q
    sampled = np.arange(rows) % 2 == 1
    fields = {"input_ids": np.zeros(t, np.int64), "positions": np.tile(np.arange(q), rows),
              "slot_mapping": np.zeros(t, np.int64), "seq_lens": np.full(rows, q),
              "row_slots": np.zeros(rows, np.int64), "cu_seqlens_q": cu, "logits_indices": cu[1:] - 1,
              "inv_temp": np.where(sampled, 1.0, 0.0).astype(np.float32), "top_p": np.full(rows, 0.9, np.float32),
              "top_k": np.where(sampled, 2, 0), "seed": np.arange(rows), "sample_pos": np.full(rows, q)}  # fmt: skip
    buf = np.empty(layout.size, np.int32)
    return torch.from_numpy(pack(layout, fields, buf).copy()).to(device), layout


def has_variants(engine: StepState) -> bool:
    """Whether the engine launches compiled Triton kernels (the CPU interpreter compiles nothing)."""
    if engine.device.type != "cuda":
        return False
    return engine.use_triton_ops or resolve_backend(engine.config.attention_backend, engine.device) == "triton"  # type: ignore[arg-type]


def warm_eager(engine: StepState, fwd: StepForward) -> None:
    """Run the eager pass at every query-block class and the attention kernels at every split padding."""
    for q in _Q_CLASSES:
        if q > engine.max_context_len:
            break
        packed, layout = padding_pass_inputs(2, q, engine.device)
        fwd.eager_pass(packed, layout, q)
    engine.out_ids.zero_()
    engine.slot_tokens.zero_()
    if not has_variants(engine):
        return
    from tokenrouter.engine.attention.triton_extend import extend_attention_triton

    warm_rope_heads(engine)
    spec, dev, dt = engine.spec, engine.device, engine.dtype
    k_cache, v_cache = engine.kv_cache.layers[0]
    seq = torch.full((1,), 1, dtype=torch.int32, device=dev)
    slots = torch.zeros(1, dtype=torch.int32, device=dev)
    for q in _Q_CLASSES:
        qt = torch.zeros(q, spec.num_heads // engine.tp.size, spec.head_dim, device=dev, dtype=dt)
        cu = torch.tensor([0, q], dtype=torch.int32, device=dev)
        seq.fill_(q)
        for s in _SPLITS:
            extend_attention_triton(qt, k_cache, v_cache, engine.table.table, cu, seq, 1.0, max_q_len=q,
                                    num_splits=s, pdl=engine.pdl, row_slots=slots)  # fmt: skip


def warm_rope_heads(engine: StepState) -> None:
    """Compile every heads-a-program variant of the q/k-norm + RoPE + KV-store kernel (`rope_heads_per_program`
    picks one from a pass's tokens, so an eager pass longer than the warm passes would compile mid-serving): one
    token on the null slot each, with the layers' own operands."""
    attn = engine.model.layers[0].self_attn
    ops = attn._ops
    if ops is None:
        return
    k_cache, v_cache = engine.kv_cache.layers[0]
    dev = engine.device
    qkv = torch.zeros(1, (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim, device=dev, dtype=engine.dtype)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)  # position 0, slot 0: the null page's first slot
    norm_w = None if attn.qk_norm_weight is None else attn.qk_norm_weight.view(2, attn.head_dim)
    hp = 1
    while hp <= ops.ROPE_MAX_HEADS:
        ops.qk_norm_rope_store(qkv, zero, attn.rope.cos_sin, norm_w, attn.eps, k_cache, v_cache, zero,
                               attn.num_heads, attn.num_kv_heads, attn.head_dim, pdl=attn.pdl,
                               heads_per_program=hp)  # fmt: skip
        hp *= 2


def profile_pass_shape(config: EngineConfig) -> tuple[int, int]:
    """(rows, tokens per row) of the largest eager pass: `max_num_batched_tokens` over up to `max_batch_size` rows."""
    t = config.max_num_batched_tokens
    rows = max(1, min(config.max_batch_size, t))
    return rows, max(1, t // rows)


def profile_memory(engine: StepState, fwd: StepForward, weights_bytes: int) -> MemoryProfile:
    """The largest eager pass's activation peak (0 on CPU) on the engine's buffers: a throwaway cache of a few pages."""
    c = engine.config
    rows, q = profile_pass_shape(c)
    mem = DeviceMemory(engine.device)
    engine.synchronize()
    before = mem.allocated()
    mem.reset_peak()
    with torch.no_grad(), engine.on_stream():
        packed, layout = padding_pass_inputs(rows, q, engine.device)
        fwd.eager_pass(packed, layout, q)
        del packed
    engine.synchronize()
    peak = max(0, mem.peak() - before)
    static = engine.table.nbytes + engine.out_ids.numel() * 4
    top = max(c.graph_buckets, default=0)
    item = torch.empty((), dtype=engine.dtype).element_size()
    static += top * (spec_hv(engine) * item) + (1 << 20)
    pool = 0
    shapes = engine.varlen_shapes
    if shapes is not None:
        static += max(sh.rows for sh in shapes.shapes) * spec_hv(engine) * item + 4 * shapes.shapes[-1].layout.size
        # The graph pool keeps about one eager peak; steps that fit no bucket still run eagerly outside it.
        pool = peak if c.cuda_graphs and engine.device.type == "cuda" else 0
    return MemoryProfile(weights=weights_bytes, activation_peak=peak, static=static, graph_pool=pool)


def spec_hv(engine: StepState) -> int:
    return engine.spec.hidden_size + engine.spec.vocab_size


def jit_cache_entries() -> int:
    """Compiled variants held by the Triton JIT caches of every loaded engine kernel module."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return 0
    seen: set[int] = set()
    total = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("tokenrouter.engine") or mod is None:
            continue
        for obj in vars(mod).values():
            fn = getattr(obj, "fn", obj)  # autotuners / heuristics wrap the JITFunction
            if isinstance(fn, JITFunction) and id(fn) not in seen:
                seen.add(id(fn))
                for caches in fn.device_caches.values():
                    total += len(caches[0])
    return total
