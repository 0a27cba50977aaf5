"""Building blocks of the decoder: RMSNorm, rotary embedding, fused linear layers, SwiGLU. Parameters are allocated
uninitialized on the target device; torch paths follow HF transformers op for op, Triton paths (`triton_ops`,
`triton_gemv`) keep the same rounding points (docs/engine.md, Model)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from tokenrouter.engine.parallel import Shard


def empty_param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def triton_ops_module(use_triton: bool) -> ModuleType | None:
    """The Triton kernels module, imported only when used (its decorators read TRITON_INTERPRET at import)."""
    return importlib.import_module("tokenrouter.engine.triton_ops") if use_triton else None


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalize in float32, cast back, then multiply by the weight in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, optionally fused with the residual add and a row gather before it."""

    def __init__(self, dim: int, eps: float, *, device: torch.device, dtype: torch.dtype, use_triton: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_param(dim, device=device, dtype=dtype)
        self._ops = triton_ops_module(use_triton)
        self.pdl = False  # programmatic dependent launch of the Triton kernel (set by the engine)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, index: torch.Tensor | None = None,
                store_sum: bool | None = None,
                out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """(RMSNorm(s), s or None), s = x (+ residual), rows gathered by `index` first; as `triton_ops.rms_norm`."""
        if self._ops is not None:
            return self._ops.rms_norm(x, self.weight, self.eps, residual, index=index, store_sum=store_sum, out=out,
                                      pdl=self.pdl)  # fmt: skip
        store = residual is not None if store_sum is None else store_sum
        if index is not None:
            x = x.index_select(0, index)
            residual = residual.index_select(0, index) if residual is not None else None
        if residual is not None:
            x = x + residual
        y = rms_norm_ref(x, self.weight, self.eps)
        if out is not None:
            out.copy_(y)
            y = out
        return y, (x if store else None)


@dataclass(slots=True)
class GemvState:
    """When the Triton skinny GEMM replaces cuBLAS, shared by a model's linear layers: inputs of 1..max_rows rows
    while `active` (a graph body or its emulation runs), 1..varlen_max_rows while `varlen` too (a varlen graph body;
    0: cuBLAS there). Limits measured on the H200 (docs/engine.md)."""

    ops: ModuleType  # tokenrouter.engine.triton_gemv
    counters: torch.Tensor
    enabled: bool = False
    max_rows: int = 8
    pdl: bool = False
    active: bool = False
    varlen: bool = False
    varlen_max_rows: int = 0  # <= triton_gemv.MAX_DOT_ROWS: the tensor-core tiles of `wide_config` past 16 rows
    prefetch: bool = False  # L2 prefetch of the first weight bytes before the PDL wait
    silu_fold_max_k: int = 4096  # SiLU(gate)*up folded into the down projection up to this K
    preload: bool = False  # weights in registers before the PDL wait: FMA tiles, tensor-core ones <= preload_max_rows
    preload_max_rows: int = 1
    fold_norm: bool = False  # residual add + RMSNorm in the qkv and gate|up projections (each program: the RMS)
    norm_fold_max_k: int = 4096
    norm_fold_max_rows: int = 1
    # Steps of norm_fold_max_rows + 1 .. this many rows fold the norm with the RMS applied last (`norm_late`: no RMS
    # pass before a program's first tile; not HF's rounding); 0: off.
    late_norm_max_rows: int = 0
    lm_head: bool = False  # the LM head of graph steps of up to `preload_max_rows` rows through the skinny GEMM

    def applies(self, x: torch.Tensor) -> bool:
        limit = self.varlen_max_rows if self.varlen else self.max_rows
        return self.enabled and self.active and 0 < x.shape[0] <= limit

    def folds_silu(self, gate_up: torch.Tensor) -> bool:
        return self.applies(gate_up) and gate_up.shape[1] // 2 <= self.silu_fold_max_k

    def folds_norm(self, x: torch.Tensor) -> bool:
        rows = max(self.norm_fold_max_rows, self.late_norm_max_rows)
        return self.fold_norm and self.applies(x) and x.shape[0] <= rows and x.shape[1] <= self.norm_fold_max_k

    def late_norm(self, x: torch.Tensor) -> bool:
        """Whether a folded norm of `x` takes the RMS last (rows past `norm_fold_max_rows`)."""
        return x.shape[0] > self.norm_fold_max_rows

    def runs_lm_head(self, h: torch.Tensor) -> bool:
        return self.lm_head and self.applies(h) and h.shape[0] <= self.preload_max_rows

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool = False, **kw):
        """`skinny_gemm` with this state's switches; `kw`: the norm fold's arguments, `out`."""
        cfg = self.ops.gemv_config(x.shape[0], *weight.shape, self.ops.device_sms(x.device))
        return self.ops.skinny_gemm(
            x, weight, bias, silu=silu, counters=self.counters, config=cfg, pdl=self.pdl, prefetch=self.prefetch,
            preload=self.preload and (x.shape[0] <= self.preload_max_rows or not cfg.dot), **kw,
        )  # fmt: skip


class MergedLinear(nn.Module):
    """Projections of one input (`shards`: checkpoint names, full output sizes) as one [sum(out), in] weight.
    `parallel` dim 0: column-parallel; dim 1: row-parallel (the caller all-reduces; piece 0 adds the bias)."""

    def __init__(self, in_features: int, shards: list[tuple[str, int]], *, bias: bool, device: torch.device,
                 dtype: torch.dtype, parallel: Shard | None = None) -> None:  # fmt: skip
        super().__init__()
        self.full_shards = shards
        self.full_in_features = in_features
        self.parallel = parallel
        if parallel is not None and parallel.dim == 0:
            shards = [(name, n // parallel.parts) for name, n in shards]
        elif parallel is not None:
            in_features //= parallel.parts
        self.shards = shards
        self.out_features = sum(n for _, n in shards)
        self.weight = empty_param(self.out_features, in_features, device=device, dtype=dtype)
        self.bias = empty_param(self.out_features, device=device, dtype=dtype) if bias else None
        # Row-parallel: every rank holds the bias (the loader fills it everywhere), one adds it.
        row = parallel is not None and parallel.dim == 1
        self.bias_here = bias and not (row and parallel.index != 0)
        self.gemv: GemvState | None = None  # set by CausalLM.attach_gemv

    def shard_slices(self) -> dict[str, slice]:
        out, off = {}, 0
        for name, n in self.shards:
            out[name] = slice(off, off + n)
            off += n
        return out

    def checkpoint_shard(self, *, bias: bool) -> Shard | None:
        """The piece of each checkpoint tensor (weight or bias of one projection) this rank holds; None: all."""
        p = self.parallel
        if p is None or (bias and p.dim == 1):
            return None
        return p

    def full_shape(self, *, bias: bool) -> tuple[int, ...]:
        out = sum(n for _, n in self.full_shards)
        return (out,) if bias else (out, self.full_in_features)

    def local_of_full(self, full: torch.Tensor, *, bias: bool) -> torch.Tensor:
        """This rank's part of the whole merged tensor (tp=1 layout: projections stacked in shard order)."""
        p = self.checkpoint_shard(bias=bias)
        if p is None:
            return full
        if p.dim == 1:
            return p.take(full)
        pieces, off = [], 0
        for _, n in self.full_shards:
            pieces.append(p.take(full[off : off + n]))
            off += n
        return torch.cat(pieces)

    @property
    def live_bias(self) -> torch.Tensor | None:
        return self.bias if self.bias_here else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None and self.gemv.applies(x):
            return self.gemv.linear(x, self.weight, self.live_bias)
        return F.linear(x, self.weight, self.live_bias)

    def forward_norm(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer of norm(x + residual), x + residual): one launch where `GemvState.folds_norm`."""
        if self.gemv is None or not self.gemv.folds_norm(x):
            h, s = norm(x, residual)
            return self(h), s
        s = torch.empty_like(x)
        y = self.gemv.linear(x, self.weight, self.live_bias, norm=(norm.weight, norm.eps), residual=residual,
                             sum_out=s, norm_late=self.gemv.late_norm(x))  # fmt: skip
        return y, s

    def forward_silu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This layer of SiLU(gate) * up of gate|up [T, 2 * in_features], one launch (where `folds_silu`)."""
        assert self.gemv is not None and self.gemv.folds_silu(gate_up)
        return self.gemv.linear(gate_up, self.weight, self.live_bias, silu=True)


class RotaryEmbedding(nn.Module):
    """NeoX-style RoPE (rotate halves); a float32 cos | sin table [max_positions, head_dim] gathered by position."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, *, device: torch.device) -> None:
        super().__init__()
        # Same expression as HF (int64 arange cast to float) so fp32 tables agree to the last bit.
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
        freqs = torch.arange(max_positions, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)
        self.half = head_dim // 2

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] by their token positions [T]."""
        cs = self.cos_sin.index_select(0, positions).to(q.dtype)
        cos, sin = cs[:, None, : self.half], cs[:, None, self.half :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class SiluAndMul(nn.Module):
    """SwiGLU activation on a fused gate|up projection: SiLU(x[:, :N]) * x[:, N:]."""

    def __init__(self, use_triton: bool) -> None:
        super().__init__()
        self._ops = triton_ops_module(use_triton)
        self.pdl = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            return self._ops.silu_and_mul(x, pdl=self.pdl)
        n = x.shape[-1] // 2
        return F.silu(x[:, :n]) * x[:, n:]
