"""Decoder-only causal LM: Qwen3 dense, with Qwen2 and Llama as configuration variants (docs/engine.md, Model).
Invariants: every tensor of a forward is packed over the step's tokens ([T, ...]); the forward never syncs with the
host nor allocates depending on tensor values (eager and graph capture run the same code); the LM head runs only on
the rows a step samples."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from tokenrouter.engine import attention
from tokenrouter.engine.config import ArchConfig
from tokenrouter.engine.layers import (
    GemvState,
    MergedLinear,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    empty_param,
    rms_norm_ref,
    triton_ops_module,
)
from tokenrouter.engine.metadata import AttentionMetadata
from tokenrouter.engine.parallel import Shard, TensorParallel, check_divides
from tokenrouter.models.spec import ModelSpec

KVLayer = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [num_pages, page_size, Hkv, D]


class DecoderAttention(nn.Module):
    """Self-attention over this rank's heads: q/k/v column-parallel, o_proj row-parallel and all-reduced."""

    def __init__(self, spec: ModelSpec, arch: ArchConfig, rope: RotaryEmbedding, tp: TensorParallel, *, device,
                 dtype, use_triton) -> None:  # fmt: skip
        super().__init__()
        self.tp = tp
        self.num_heads, self.num_kv_heads = spec.num_heads // tp.size, spec.num_kv_heads // tp.size
        self.head_dim = spec.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.eps = spec.rms_norm_eps
        kw = {"device": device, "dtype": dtype}
        q_full, kv_full = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = MergedLinear(spec.hidden_size, [("q_proj", q_full), ("k_proj", kv_full), ("v_proj", kv_full)],
                                     bias=arch.qkv_bias, parallel=tp.shard(0), **kw)  # fmt: skip
        self.o_proj = MergedLinear(q_full, [("o_proj", spec.hidden_size)], bias=arch.o_bias, parallel=tp.shard(1),
                                   **kw)  # fmt: skip
        # Qwen3 q_norm | k_norm weights side by side ([2 * head_dim]) so one kernel reads both.
        self.qk_norm_weight = empty_param(2 * self.head_dim, **kw) if arch.qk_norm else None
        self.rope = rope
        self._ops = triton_ops_module(use_triton)
        self.pdl = False

    def _norm_w(self) -> torch.Tensor | None:
        """q_norm | k_norm weights as the Triton kernels take them ([2, head_dim]), or None."""
        return None if self.qk_norm_weight is None else self.qk_norm_weight.view(2, self.head_dim)

    def _fuses_rope(self, meta: AttentionMetadata, device: torch.device) -> bool:
        """Decode attention does q/k norm, RoPE and the KV write itself (`EngineConfig.decode_fused_rope`): Triton
        ops and attention, decode layout, a head_dim it takes."""
        return (meta.fused_rope_rows > 0 and meta.is_decode and self._ops is not None
                and attention.fused_rope_applies(meta.backend, device, self.head_dim))  # fmt: skip

    def attend(self, qkv: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv: KVLayer) -> torch.Tensor:
        """The layer after its qkv projection: q/k norm, RoPE, KV write, attention, o projection."""
        t = qkv.shape[0]
        k_cache, v_cache = kv
        if self._fuses_rope(meta, qkv.device):
            o = attention.decode_attention_fused_rope(
                qkv, positions, self.rope.cos_sin, self._norm_w(), self.eps, k_cache, v_cache, meta.slot_mapping,
                meta.block_tables, meta.seq_lens, self.scale, num_heads=self.num_heads, num_splits=meta.num_splits,
                counters=meta.split_counters, pdl=meta.pdl, row_slots=meta.row_slots,
                max_row_tokens=meta.fused_rope_rows,
            )  # fmt: skip
            return self.tp.all_reduce(self.o_proj(o.reshape(t, self.q_size)))
        if self._ops is not None:
            q = self._ops.qk_norm_rope_store(
                qkv, positions, self.rope.cos_sin, self._norm_w(), self.eps, k_cache, v_cache, meta.slot_mapping,
                self.num_heads, self.num_kv_heads, self.head_dim, pdl=self.pdl,
            )  # fmt: skip
        else:
            q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.num_kv_heads, self.head_dim)
            v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
            if self.qk_norm_weight is not None:
                q = rms_norm_ref(q, self.qk_norm_weight[: self.head_dim], self.eps)
                k = rms_norm_ref(k, self.qk_norm_weight[self.head_dim :], self.eps)
            q, k = self.rope(positions, q, k)
            attention.store_kv(k, v.contiguous(), k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode:
            o = attention.decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale,
                num_splits=meta.num_splits, backend=meta.backend, counters=meta.split_counters, pdl=meta.pdl,
                row_slots=meta.row_slots,
            )  # fmt: skip
        elif meta.long_rows is None:
            o = attention.extend_attention(
                q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, self.scale,
                max_q_len=meta.max_q_len, backend=meta.backend, pdl=meta.pdl, row_slots=meta.row_slots,
                counters=meta.extend_counters,
            )  # fmt: skip
        else:  # varlen graph: long-row group, then short-row group, both writing their tokens of one output
            o = torch.empty_like(q)
            n, cu, sl, rs = meta.long_rows, meta.cu_seqlens_q, meta.seq_lens, meta.row_slots
            assert cu is not None and rs is not None
            # Only the short group splits by context: its rows are returns (~10 tokens) on long prefixes; the long
            # group's prefills already fill the GPU with query blocks.
            for a, b, mq, keys, bm in (
                (0, n, meta.max_q_len, 0, 0),
                (n, sl.shape[0], meta.short_q_len, meta.short_split_keys, meta.short_block_m),
            ):
                attention.extend_attention(
                    q, k_cache, v_cache, meta.block_tables, cu[a : b + 1], sl[a:b], self.scale, max_q_len=mq,
                    out=o, backend=meta.backend, pdl=meta.pdl, row_slots=rs[a:b], counters=meta.extend_counters,
                    split_keys=keys, split_programs=meta.short_split_programs if keys else 0, block_m=bm,
                )  # fmt: skip
        return self.tp.all_reduce(self.o_proj(o.reshape(t, self.q_size)))


class DecoderMLP(nn.Module):
    """SwiGLU MLP over this rank's share: gate/up column-parallel, down row-parallel and all-reduced."""

    def __init__(self, spec: ModelSpec, tp: TensorParallel, *, device, dtype, use_triton) -> None:
        super().__init__()
        self.tp = tp
        inter = spec.intermediate_size
        kw = {"device": device, "dtype": dtype}
        self.gate_up_proj = MergedLinear(spec.hidden_size, [("gate_proj", inter), ("up_proj", inter)], bias=False,
                                         parallel=tp.shard(0), **kw)  # fmt: skip
        self.act = SiluAndMul(use_triton)
        self.down_proj = MergedLinear(inter, [("down_proj", spec.hidden_size)], bias=False, parallel=tp.shard(1),
                                      **kw)  # fmt: skip

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP after its gate|up projection."""
        gemv = self.down_proj.gemv
        if gemv is not None and gemv.folds_silu(gate_up):  # skinny GEMM, SiLU(gate) * up applied while loading x
            return self.tp.all_reduce(self.down_proj.forward_silu(gate_up))
        return self.tp.all_reduce(self.down_proj(self.act(gate_up)))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, arch: ArchConfig, rope: RotaryEmbedding, tp: TensorParallel, *, device,
                 dtype, use_triton) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype, "use_triton": use_triton}
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw)
        self.self_attn = DecoderAttention(spec, arch, rope, tp, **kw)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw)
        self.mlp = DecoderMLP(spec, tp, **kw)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, meta: AttentionMetadata,
                kv: KVLayer, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(output, residual): the stream after this layer is their sum (the add is fused into the next norm;
        `residual` None: `x` is the embedding). `index` (first layer): `x` is the table, the norm gathers rows."""
        attn, mlp = self.self_attn, self.mlp
        if index is not None:
            h, residual = self.input_layernorm(x, index=index, store_sum=True)
            qkv = attn.qkv_proj(h)
        elif residual is None:
            qkv = attn.qkv_proj(self.input_layernorm(x)[0])
            residual = x
        else:  # the norms fold into the projections after them where the skinny GEMM runs (forward_norm)
            qkv, residual = attn.qkv_proj.forward_norm(self.input_layernorm, x, residual)
        h = attn.attend(qkv, positions, meta, kv)
        gate_up, residual = mlp.gate_up_proj.forward_norm(self.post_attention_layernorm, h, residual)
        return mlp.down(gate_up), residual


class CausalLM(nn.Module):
    """Qwen3 / Qwen2 / Llama ForCausalLM by `ArchConfig` switches; with `tp`, this rank's shard of it."""

    def __init__(
        self, spec: ModelSpec, arch: ArchConfig, max_positions: int, *, device, dtype, use_triton: bool = False,
        tp: TensorParallel | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        tp = tp if tp is not None else TensorParallel()
        check_divides(spec, tp.size)
        self.spec, self.arch, self.tp = spec, arch, tp
        kw = {"device": device, "dtype": dtype}
        self.rope = RotaryEmbedding(spec.head_dim, arch.rope_theta, max_positions, device=device)
        self.embed_tokens = empty_param(spec.vocab_size, spec.hidden_size, **kw)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, arch, self.rope, tp, **kw, use_triton=use_triton) for _ in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw, use_triton=use_triton)
        # Tied models read the embedding table as the LM head: one tensor, no copy.
        tied = spec.tie_word_embeddings
        self.lm_head = self.embed_tokens if tied else empty_param(spec.vocab_size, spec.hidden_size, **kw)
        self.gemv: GemvState | None = None  # Triton skinny GEMM of small graph steps (attach_gemv)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_layers: list[KVLayer]) -> torch.Tensor:  # fmt: skip
        """Residual stream after the last layer (before the final norm), [T, hidden]."""
        x, residual = self.forward_stream(input_ids, positions, meta, kv_layers)
        return x + residual

    def forward_stream(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv_layers: list[KVLayer], *,
                       fuse_embedding: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(last layer output, residual before it); `fuse_embedding`: the first norm gathers the embedding rows."""
        if fuse_embedding:
            x, index = self.embed_tokens, input_ids
        else:
            x, index = F.embedding(input_ids, self.embed_tokens), None
        residual = None
        for layer, kv in zip(self.layers, kv_layers, strict=True):
            x, residual = layer(x, residual, positions, meta, kv, index)
            index = None
        assert residual is not None
        return x, residual

    def compute_logits(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                       index: torch.Tensor | None = None, *, out_hidden: torch.Tensor | None = None,
                       out_logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(final-norm hidden, logits) of `hidden` (+ `residual`), rows `index`; `out_*`: a graph's static outputs."""
        h, _ = self.norm(hidden, residual, index=index, store_sum=False, out=out_hidden)
        if out_logits is None:
            return h, F.linear(h, self.lm_head)
        if self.gemv is not None and self.gemv.runs_lm_head(h):
            self.gemv.linear(h, self.lm_head, None, out=out_logits)
        else:
            torch.mm(h, self.lm_head.t(), out=out_logits)
        return h, out_logits

    def set_pdl(self, enabled: bool) -> None:
        """Programmatic dependent launch for every Triton elementwise kernel of the model."""
        for m in self.modules():
            if hasattr(m, "pdl"):
                m.pdl = enabled
        if self.gemv is not None:
            self.gemv.pdl = enabled

    def attach_gemv(self, state: GemvState) -> None:
        """Let every linear layer use the Triton skinny GEMM under `state`'s conditions (see `GemvState`)."""
        self.gemv = state
        for m in self.modules():
            if isinstance(m, MergedLinear):
                m.gemv = state

    @contextlib.contextmanager
    def gemv_scope(self, *, varlen: bool = False) -> Iterator[None]:
        """Inside (the engine's CUDA-graph bodies): linear layers of small inputs use the skinny GEMM if enabled;
        `varlen` (a varlen graph body): up to `GemvState.varlen_max_rows` rows instead of `max_rows`."""
        if self.gemv is None:
            yield
            return
        prev = self.gemv.active, self.gemv.varlen
        self.gemv.active, self.gemv.varlen = True, varlen
        try:
            yield
        finally:
            self.gemv.active, self.gemv.varlen = prev

    def checkpoint_params(self) -> dict[str, tuple[nn.Parameter, slice | None]]:
        """HF checkpoint tensor name -> (our parameter, row slice inside it or None for the whole tensor)."""
        out: dict[str, tuple[nn.Parameter, slice | None]] = {"model.embed_tokens.weight": (self.embed_tokens, None)}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (layer.input_layernorm.weight, None)
            out[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm.weight, None)
            attn = layer.self_attn
            merged = {"self_attn.": (attn.qkv_proj, attn.o_proj), "mlp.": (layer.mlp.gate_up_proj, layer.mlp.down_proj)}
            for prefix, mods in merged.items():
                for mod in mods:
                    _add_merged(out, p + prefix, mod)
            if attn.qk_norm_weight is not None:
                d = attn.head_dim
                out[p + "self_attn.q_norm.weight"] = (attn.qk_norm_weight, slice(0, d))
                out[p + "self_attn.k_norm.weight"] = (attn.qk_norm_weight, slice(d, 2 * d))
        out["model.norm.weight"] = (self.norm.weight, None)
        if not self.spec.tie_word_embeddings:
            out["lm_head.weight"] = (self.lm_head, None)
        return out

    def merged_layers(self) -> Iterator[tuple[str, MergedLinear]]:
        """(checkpoint prefix, layer) of every fused linear layer, e.g. ("model.layers.0.self_attn.", qkv_proj)."""
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            yield p + "self_attn.", layer.self_attn.qkv_proj
            yield p + "self_attn.", layer.self_attn.o_proj
            yield p + "mlp.", layer.mlp.gate_up_proj
            yield p + "mlp.", layer.mlp.down_proj

    def checkpoint_shards(self) -> dict[str, Shard]:
        """HF checkpoint tensor name -> the piece of it this rank holds, for the tensors tensor parallelism splits."""
        out: dict[str, Shard] = {}
        for prefix, mod in self.merged_layers():
            for name, _ in mod.full_shards:
                for kind, is_bias in (("weight", False), ("bias", True)):
                    shard = mod.checkpoint_shard(bias=is_bias)
                    if shard is not None and (not is_bias or mod.bias is not None):
                        out[f"{prefix}{name}.{kind}"] = shard
        return out

    def full_layouts(self) -> dict[int, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]]:
        """id(split parameter) -> (full tp=1 shape, full -> this rank's part): every tp draws one dummy model."""
        out: dict[int, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {}
        if self.tp.size == 1:
            return out
        for _, mod in self.merged_layers():
            for p, is_bias in ((mod.weight, False), (mod.bias, True)):
                if p is not None and mod.checkpoint_shard(bias=is_bias) is not None:
                    out[id(p)] = (mod.full_shape(bias=is_bias), partial(mod.local_of_full, bias=is_bias))
        return out


def _add_merged(out: dict, prefix: str, mod: MergedLinear) -> None:
    single = len(mod.shards) == 1
    for name, sl in mod.shard_slices().items():
        out[f"{prefix}{name}.weight"] = (mod.weight, None if single else sl)
        if mod.bias is not None:
            out[f"{prefix}{name}.bias"] = (mod.bias, None if single else sl)
