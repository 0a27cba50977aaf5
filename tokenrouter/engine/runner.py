"""`Engine`: our PyTorch + Triton `ModelRunner` (one model, one paged KV cache, optional CUDA graphs).

Step flow: pack the batch on the host (`inputs.prepare_step`) into a reusable staging buffer (pinned on
CUDA) -> one async H2D copy -> graph replay (decode / small-extend batches) or an eager forward (prefill
and large batches) -> sample -> outputs as device tensors. No `.item()`/`.tolist()` on device data: the
caller decides when to sync.

Per-engine state only (stream, graph pool, buffers, RNG), so several engines, even of different models,
can share a process and a GPU. All device work runs on the engine's own CUDA stream; the caller's current
stream is made to wait for it before outputs are handed over (a device-side wait, not a host sync).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import random

import torch

from tokenrouter.core.batch import Batch, BatchRow, StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.engine.attention import resolve_backend, split_counters
from tokenrouter.engine.base import ModelRunner
from tokenrouter.engine.config import EngineConfig, arch_config
from tokenrouter.engine.errors import BatchError, ModelLoadError
from tokenrouter.engine.graphs import GraphOutputs, GraphRunner
from tokenrouter.engine.inputs import HostStep, Layout, prepare_step
from tokenrouter.engine.kv_cache import KVCache, num_pages_for_budget
from tokenrouter.engine.loader import init_dummy_weights, load_safetensors, resolve_spec
from tokenrouter.engine.metadata import AttentionMetadata
from tokenrouter.engine.model import CausalLM
from tokenrouter.engine.sampler import SamplingInputs, sample

log = logging.getLogger(__name__)

_Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (final-norm hidden, logits, greedy tokens) per row


class _Staging:
    """Two alternating host buffers for packed inputs; pinned on CUDA so the H2D copy is async.

    A buffer is rewritten only after the copy that last read it has finished (its event), which bounds the
    host's run-ahead to two steps without ever waiting on compute the caller did not ask about.
    """

    def __init__(self, device: torch.device, capacity: int = 1 << 16) -> None:
        self.pinned = device.type == "cuda"
        self.bufs = [self._alloc(capacity), self._alloc(capacity)]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.i = 0

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int32, pin_memory=self.pinned)

    def next(self, size: int) -> torch.Tensor:
        self.i ^= 1
        ev = self.events[self.i]
        if ev is not None:
            ev.synchronize()
        if self.bufs[self.i].numel() < size:
            self.bufs[self.i] = self._alloc(max(size, 2 * self.bufs[self.i].numel()))
        return self.bufs[self.i]

    def record(self, stream: torch.cuda.Stream | None) -> None:
        if self.pinned and stream is not None:
            ev = torch.cuda.Event()
            ev.record(stream)
            self.events[self.i] = ev


class Engine(ModelRunner):
    """Executes one model. Constructor loads weights, allocates the KV cache and captures graphs.

    `kv_pool`: pass the scheduler's pool to share it, or leave None and the engine builds one from
    `config.kv_cache_bytes` / `config.num_pages` (then hand `engine.kv_pool` to the scheduler).
    """

    def __init__(self, config: EngineConfig, kv_pool: KVPool | None = None) -> None:
        self.config = config
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device)
        self.spec, ckpt_dir = resolve_spec(config.model)
        arch = arch_config(self.spec)
        fmt = config.load_format
        if fmt == "auto":
            fmt = "safetensors" if ckpt_dir is not None else "dummy"
        if fmt == "safetensors" and ckpt_dir is None:
            raise ModelLoadError(f"{config.model}: safetensors loading needs a model directory")

        self._pool = kv_pool if kv_pool is not None else self._make_pool()
        ps = self._pool.page_size
        if self._pool.num_pages * ps >= 2**31:
            raise ValueError("KV pool too large for int32 slot indices")
        limit = min(self.spec.max_position_embeddings, self._pool.capacity_tokens)
        self._max_context_len = min(config.max_context_len or limit, limit)
        self.max_pages_per_row = -(-self._max_context_len // ps)

        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._rng = random.Random(config.seed)
        self._staging = _Staging(self.device)
        self._prev: tuple[list[BatchRow], torch.Tensor] | None = None
        # Runtime switch (ablations, benchmarks): False sends every batch down the eager path.
        self.use_graphs = True
        self.graph_error: str | None = None
        self.pdl_error: str | None = None  # why programmatic dependent launch was turned off, if it was
        self.graphs: GraphRunner | None = None
        self._use_triton_ops = config.use_triton_ops(self.device)
        triton_attn = resolve_backend(config.attention_backend, self.device) == "triton"  # type: ignore[arg-type]
        self.pdl = (
            config.triton_pdl
            and self.device.type == "cuda"
            and (self._use_triton_ops or triton_attn)
            and torch.cuda.get_device_capability(self.device) >= (9, 0)
        )
        self._fuse_step = config.fuse_step_ops
        # All device work, construction included, runs on the engine's stream; the syncs order it against
        # whatever the process did before on other streams.
        self._sync()
        with torch.no_grad(), self._on_stream():
            self.model = CausalLM(
                self.spec,
                arch,
                self._max_context_len,
                device=self.device,
                dtype=self.dtype,
                use_triton=self._use_triton_ops,
            )
            self.model.set_pdl(self.pdl)
            self._attach_gemv()
            # Arrival counters of the fused split-KV merge: one per (attention row, KV head), per engine so
            # that engines on other streams never share them.
            rows = max(config.max_batch_size, max(config.graph_buckets, default=1))
            self._split_counters = (
                split_counters(rows, self.spec.num_kv_heads, self.device)
                if config.decode_fused_reduce and triton_attn
                else None
            )
            if fmt == "dummy":
                init_dummy_weights(self.model, config.seed)
            else:
                load_safetensors(self.model, ckpt_dir)
            self.kv_cache = KVCache(self.spec, self._pool, device=self.device, dtype=self.dtype)
            self._build_graphs()
        self._sync()

    def _attach_gemv(self) -> None:
        """The Triton skinny GEMM state for graph steps (CUDA with the Triton ops; interpreter tests with
        ops_backend="triton"); `triton_gemv` only decides whether it starts enabled (`set_triton_gemv`)."""
        if not self._use_triton_ops:
            return
        from tokenrouter.engine.layers import GemvState

        c = self.config
        ops = importlib.import_module("tokenrouter.engine.triton_gemv")
        max_n = max(self.spec.hidden_size, self.model.layers[0].self_attn.qkv_proj.out_features,
                    2 * self.spec.intermediate_size) if len(self.model.layers) else 1  # fmt: skip
        state = GemvState(ops=ops, counters=ops.arrival_counters(max_n, self.device), enabled=c.triton_gemv,
                          max_rows=c.gemv_max_rows, pdl=self.pdl)  # fmt: skip
        self.model.attach_gemv(state)

    @property
    def gemv_enabled(self) -> bool:
        """Whether graph steps of up to `config.gemv_max_rows` tokens use the Triton skinny GEMM."""
        return self.model.gemv is not None and self.model.gemv.enabled

    def set_triton_gemv(self, enabled: bool, *, max_rows: int | None = None, prefetch: bool | None = None) -> None:
        """Ablations and benchmarks: switch the skinny GEMM of graph steps on/off (and its row limit, its L2
        prefetch before the PDL wait) and recapture the graphs, reusing the weights. Raises if the engine has no
        Triton ops (then the switch cannot apply)."""
        g = self.model.gemv
        if g is None:
            raise ValueError("the skinny GEMM needs the Triton ops (CUDA, or ops_backend='triton')")
        self._sync()
        g.enabled = enabled
        if max_rows is not None:
            if not 1 <= max_rows <= g.ops.MAX_ROWS:
                raise ValueError(f"max_rows must be in 1..{g.ops.MAX_ROWS}, got {max_rows}")
            g.max_rows = max_rows
        if prefetch is not None:
            g.prefetch = prefetch
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        with torch.no_grad(), self._on_stream():
            self._build_graphs()
        self._sync()

    def _build_graphs(self) -> None:
        c = self.config
        capture = c.cuda_graphs and self.device.type == "cuda"
        if not c.graph_buckets or not (capture or c.graph_emulation):
            return
        self.graphs = GraphRunner(
            self._forward_into,
            c.graph_buckets,
            self.max_pages_per_row,
            hidden_size=self.spec.hidden_size,
            vocab_size=self.spec.vocab_size,
            device=self.device,
            dtype=self.dtype,
            stream=self.stream,
            capture=capture,
        )
        try:
            self._sync()
            self.graphs.capture_all()
        except Exception as e:  # a kernel that cannot be captured must not take the engine down
            error = f"{type(e).__name__}: {e}".splitlines()[0]
            self.graphs.close()
            self.graphs = None
            if self.pdl:  # retry once without programmatic dependent launch
                log.warning("CUDA graph capture failed with PDL, retrying without it: %s", error)
                self.pdl_error = error
                self.set_pdl(False)
                self._build_graphs()
                return
            self.graph_error = error
            log.warning("CUDA graph capture failed, running eagerly: %s", self.graph_error)

    def set_pdl(self, enabled: bool) -> None:
        """Turn programmatic dependent launch on/off for later eager steps and graph captures (already captured
        graphs keep what they were captured with)."""
        self._sync()
        self.pdl = enabled
        self.model.set_pdl(enabled)
        if self._split_counters is not None:
            self._split_counters.zero_()  # a failed capture may have left a launch half-recorded

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- ModelRunner interface ----------------------------------------------------------------------------
    @property
    def kv_pool(self) -> KVPool:
        return self._pool

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size

    @property
    def max_context_len(self) -> int:
        return self._max_context_len

    @property
    def graphs_enabled(self) -> bool:
        return self.graphs is not None and bool(self.graphs.graphs)

    @torch.no_grad()
    def step(self, batch: Batch, *, return_logits: bool = False, return_hidden: bool = False) -> StepResult:
        rows = batch.rows
        if len(rows) > self.config.max_batch_size:
            raise BatchError(f"batch has {len(rows)} rows, max_batch_size is {self.config.max_batch_size}")
        caller = torch.cuda.current_stream(self.device) if self.stream is not None else None
        with self._on_stream():
            bucket = self._graph_bucket(batch)
            if bucket is not None:
                host, (hidden, logits, greedy) = self._run_graph(batch, bucket)
            else:
                host, (hidden, logits, greedy) = self._run_eager(batch)
            static = bucket is not None  # outputs are views of graph buffers the next replay overwrites
            params = [row.req.sampling for row in rows]
            if all(p.temperature <= 0 for p in params):
                tokens = greedy.clone() if static else greedy
            else:
                fallback = [self._rng.getrandbits(32) for _ in rows]
                s = SamplingInputs.build(params, host.sample_positions, self.spec.vocab_size, fallback, self.device)
                tokens = sample(logits, s)
            out_logits = logits.to(torch.float32, copy=static) if return_logits else None
            out_hidden = (hidden.clone() if static else hidden) if return_hidden else None
        self._prev = (list(rows), tokens)  # for from_prev rows of the next step
        if caller is not None:
            caller.wait_stream(self.stream)
            for t in (tokens, out_logits, out_hidden):
                if t is not None:
                    t.record_stream(caller)
        return StepResult(next_token_ids=tokens, logits=out_logits, hidden=out_hidden)

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        self._prev = None
        for name in ("model", "kv_cache"):
            if hasattr(self, name):
                delattr(self, name)

    # ---- internals ----------------------------------------------------------------------------------------
    def _make_pool(self) -> KVPool:
        c = self.config
        if (c.kv_cache_bytes is None) == (c.num_pages is None):
            raise ValueError("set exactly one of EngineConfig.kv_cache_bytes and num_pages (or pass a KVPool)")
        pages = c.num_pages or num_pages_for_budget(self.spec, c.kv_cache_bytes, c.page_size, self.dtype)
        return KVPool(pages, c.page_size)

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _graph_bucket(self, batch: Batch) -> int | None:
        g = self.graphs
        if g is None or not self.use_graphs:
            return None
        limit = self.config.graph_max_row_tokens
        total = 0
        for row in batch.rows:
            if row.num_tokens > limit:
                return None
            total += row.num_tokens
        return g.bucket_for(total)

    def _prev_rows(self, batch: Batch) -> dict[int, int] | None:
        if self._prev is None or not any(getattr(r, "from_prev", False) for r in batch.rows):
            return None
        return {id(r.req): i for i, r in enumerate(self._prev[0]) if r.sample}

    def _patch_from_prev(self, host: HostStep, input_ids: torch.Tensor) -> None:
        """Feed the previous step's sampled tokens (still on the device) to this step's from_prev rows."""
        if not host.prev_dst:
            return
        assert self._prev is not None
        cuda = self.device.type == "cuda"
        idx = torch.tensor([host.prev_dst, host.prev_src], dtype=torch.int64, pin_memory=cuda)
        idx = idx.to(self.device, non_blocking=cuda)
        input_ids.index_copy_(0, idx[0], self._prev[1].index_select(0, idx[1]).to(input_ids.dtype))

    def _prepare(self, batch: Batch, bucket: int | None) -> tuple[HostStep, torch.Tensor]:
        if bucket is not None:
            assert self.graphs is not None
            width, size = self.max_pages_per_row, self.graphs.layouts[bucket].size
        else:
            width, size = None, self._eager_size_bound(batch)
        buf = self._staging.next(size)
        host = prepare_step(
            batch,
            self._pool.page_size,
            self._max_context_len,
            bucket=bucket,
            width=width,
            prev_rows=self._prev_rows(batch),
            out=buf.numpy(),
        )
        return host, buf

    def _eager_size_bound(self, batch: Batch) -> int:
        """Upper bound of the packed size of an eager step (sized before packing)."""
        ps = self._pool.page_size
        r = len(batch.rows)
        t = sum(row.num_tokens for row in batch.rows)
        w = max(-(-(row.start + row.num_tokens) // ps) for row in batch.rows) if r else 0
        return 3 * t + 3 * r + 1 + r * w

    def _run_graph(self, batch: Batch, bucket: int) -> tuple[HostStep, _Outputs]:
        g = self.graphs
        assert g is not None
        host, buf = self._prepare(batch, bucket)
        g.load(buf, bucket)
        self._staging.record(self.stream)
        self._patch_from_prev(host, g.input_ids(bucket))
        g.run(bucket)
        r = host.num_rows
        return host, (g.out.hidden[:r], g.out.logits[:r], g.out.greedy[:r])

    def _run_eager(self, batch: Batch) -> tuple[HostStep, _Outputs]:
        host, buf = self._prepare(batch, None)
        n = host.layout.size
        # CPU: clone, since the staging buffer is rewritten by the next step.
        cuda = self.device.type == "cuda"
        packed = buf[:n].to(self.device, non_blocking=True) if cuda else buf[:n].clone()
        self._staging.record(self.stream)
        off, cnt = host.layout.offsets()["input_ids"]
        self._patch_from_prev(host, packed[off : off + cnt])
        return host, self._forward(packed, host.layout, host.max_q_len)

    def _forward(
        self, packed: torch.Tensor, layout: Layout, max_q_len: int, out: GraphOutputs | None = None
    ) -> _Outputs:
        """Model forward over a packed int32 device buffer -> (final-norm hidden, logits, greedy tokens).

        With `fuse_step_ops`, `out` (a graph's static outputs) receives the results directly."""
        v = {name: packed[off : off + n] for name, (off, n) in layout.offsets().items()}
        fuse = self._fuse_step
        slots = v["slot_mapping"]
        meta = AttentionMetadata(
            # The Triton KV-store kernel reads int32 slots; the torch path wants int64 for index_copy_.
            slot_mapping=slots if fuse and self._use_triton_ops else slots.long(),
            block_tables=v["block_tables"].view(layout.num_attn_rows, layout.width),
            seq_lens=v["seq_lens"],
            cu_seqlens_q=v.get("cu_seqlens_q"),
            max_q_len=max_q_len,
            num_splits=self.config.decode_num_splits,
            backend=self.config.attention_backend,
            split_counters=self._split_counters,
            pdl=self.pdl,
        )
        if not fuse:
            hidden = self.model(v["input_ids"], v["positions"], meta, self.kv_cache.layers)
            h, logits = self.model.compute_logits(hidden.index_select(0, v["logits_indices"]))
            return h, logits, logits.argmax(dim=-1)
        x, residual = self.model.forward_stream(
            v["input_ids"], v["positions"], meta, self.kv_cache.layers, fuse_embedding=self._use_triton_ops
        )
        n = layout.num_logit_rows
        h, logits = self.model.compute_logits(
            x,
            residual,
            v["logits_indices"],
            out_hidden=out.hidden[:n] if out is not None else None,
            out_logits=out.logits[:n] if out is not None else None,
        )
        greedy = torch.argmax(logits, dim=-1, out=out.greedy[:n]) if out is not None else logits.argmax(dim=-1)
        return h, logits, greedy

    def _forward_into(self, packed: torch.Tensor, layout: Layout, out: GraphOutputs) -> None:
        """Graph body: the forward writing into the runner's static outputs; the only place where the Triton
        skinny GEMM may replace cuBLAS (small buckets, `triton_gemv`)."""
        with self.model.gemv_scope():
            self._forward_body(packed, layout, out)

    def _forward_body(self, packed: torch.Tensor, layout: Layout, out: GraphOutputs) -> None:
        if self._fuse_step:
            self._forward(packed, layout, 1, out)
            return
        h, logits, greedy = self._forward(packed, layout, 1)
        n = layout.num_logit_rows
        out.hidden[:n].copy_(h)
        out.logits[:n].copy_(logits)
        out.greedy[:n].copy_(greedy)
