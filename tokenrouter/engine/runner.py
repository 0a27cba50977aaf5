"""`Engine`: our PyTorch + Triton `ModelRunner` (docs/engine.md, Steps and handles). A step: host plan -> H2D copy
-> graph replay, then the eager part -> one D2H copy into a pinned ring slot -> an event; nothing here syncs with
the device. All state is per engine, so several engines share a process and a GPU."""

from __future__ import annotations

import contextlib
import importlib
import logging
import random
import time

import numpy as np
import torch

from tokenrouter.core.batch import Batch
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.core.kv import KVPool
from tokenrouter.core.router import DeviceRouter
from tokenrouter.engine import tp_step
from tokenrouter.engine import warmup as warm
from tokenrouter.engine.attention import resolve_backend, split_counters
from tokenrouter.engine.base import ModelRunner
from tokenrouter.engine.config import EngineConfig, arch_config
from tokenrouter.engine.errors import BatchError, EngineError, ModelLoadError, StepFailed
from tokenrouter.engine.faults import FaultInjection
from tokenrouter.engine.forward import StepForward
from tokenrouter.engine.gpu_sharing import check_mps, make_stream
from tokenrouter.engine.graphs import GraphRunner
from tokenrouter.engine.handles import HostExtras, OutputRing, Staging, StepHandle
from tokenrouter.engine.inputs import Layout
from tokenrouter.engine.kv_cache import KVCache, kv_bytes_per_page
from tokenrouter.engine.layers import GemvState
from tokenrouter.engine.loader import init_dummy_weights, load_safetensors, resolve_spec
from tokenrouter.engine.memory import DeviceMemory, MemoryProfile, MemoryReport, kv_bytes_for_budget
from tokenrouter.engine.model import CausalLM
from tokenrouter.engine.page_table import PageTable
from tokenrouter.engine.parallel import TensorParallel, check_divides
from tokenrouter.engine.plan_types import PartPlan
from tokenrouter.engine.sampler import LOGPROB_WORDS
from tokenrouter.engine.step_plan import PlanContext, StepPlan, plan_step
from tokenrouter.engine.tp_step import StepSink
from tokenrouter.engine.varlen_shapes import VarlenShapes, max_pad_tokens

log = logging.getLogger(__name__)


class Engine(ModelRunner):
    """One model. The constructor loads weights, sizes the KV cache, captures the graphs and warms every kernel up.

    `kv_pool`: the scheduler's pool, or None to build one (`engine.kv_pool`). `router`: a router's device part, run
    inside every step. `tp` (docs/tensor-parallel.md): this engine's rank; all ranks construct together (collectives);
    rank 0 takes batches and publishes each planned step to its `followers`, the others run `tp_step.follow`.
    """

    def __init__(self, config: EngineConfig, kv_pool: KVPool | None = None, *, router: DeviceRouter | None = None,
                 tp: TensorParallel | None = None, followers: StepSink | None = None) -> None:  # fmt: skip
        t0 = time.perf_counter()
        self.config = config
        self.tp = tp if tp is not None else TensorParallel()
        if self.tp.size > 1 and self.tp.leader and followers is None:
            raise ValueError("rank 0 of a tensor-parallel engine needs a StepSink for its followers")
        if not self.tp.leader and followers is not None:
            raise ValueError(f"rank {self.tp.rank} follows rank 0; only rank 0 has followers")
        self.followers = followers
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device)
        self.spec, ckpt_dir = resolve_spec(config.model)
        check_divides(self.spec, self.tp.size)
        arch = arch_config(self.spec)
        fmt = config.load_format
        if fmt == "auto":
            fmt = "safetensors" if ckpt_dir is not None else "dummy"
        if fmt == "safetensors" and ckpt_dir is None:
            raise ModelLoadError(f"{config.model}: safetensors loading needs a model directory")
        self.closed = False
        check_mps(config.mps_active_thread_percentage)
        self.stream, self.green_context = make_stream(self.device, config.stream_priority, config.green_context_sms)
        self.mem = DeviceMemory(self.device)
        self.faults = FaultInjection(set(config.fail_step_ids), fail_captures=config.fail_captures)
        self._rng = random.Random(config.seed)
        self.router = router
        self.use_graphs = True  # runtime switch (ablations): False runs every row in the eager pass
        self.timing = False  # record GPU start/end events per step (studies: idle gaps between steps)
        self.graph_error: str | None = None
        self.pdl_error: str | None = None
        self.graphs: GraphRunner | None = None
        self.vgraphs: GraphRunner | None = None  # varlen graphs (`varlen_shapes`)
        self.capture_stats: dict[str, float] = {"decode_graphs": 0, "varlen_graphs": 0, "capture_s": 0.0}
        self._rules: dict[bool, GraphRule] = {}
        self.use_triton_ops = config.use_triton_ops(self.device)
        self.triton_attn = resolve_backend(config.attention_backend, self.device) == "triton"  # type: ignore[arg-type]
        self.pdl = (config.triton_pdl and self.device.type == "cuda" and (self.use_triton_ops or self.triton_attn)
                    and torch.cuda.get_device_capability(self.device) >= (9, 0))  # fmt: skip
        self.synchronize()
        base = self.mem.allocated()
        log.info("%s: loading %s weights on %s", self.spec.name, "dummy" if fmt == "dummy" else "safetensors",
                 self.device)  # fmt: skip
        with torch.no_grad(), self.on_stream():
            self.model = CausalLM(self.spec, arch, self.spec.max_position_embeddings, device=self.device,
                                  dtype=self.dtype, use_triton=self.use_triton_ops, tp=self.tp)  # fmt: skip
            self.model.set_pdl(self.pdl)
            self._attach_gemv()
            if fmt == "dummy":
                init_dummy_weights(self.model, config.seed)
            else:
                load_safetensors(self.model, ckpt_dir)
        self.synchronize()
        measured = max(self.mem.allocated() - base, 0)  # 0 on CPU: count the parameters
        self.weights_bytes = measured or sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.budget = self._budget()
        self.memory_profile: MemoryProfile | None = None  # the start-up measurement (with a memory budget)
        self._pool = kv_pool if kv_pool is not None else self._make_pool()
        self._finish_init(t0)

    # ---- construction ---------------------------------------------------------------------------------
    def _finish_init(self, t0: float) -> None:
        c = self.config
        self._setup_buffers()
        cuda = self.device.type == "cuda"
        self._staging = Staging(cuda)
        self._ring = OutputRing(self.out_ids.numel(), cuda)
        if c.cuda_graphs and cuda:
            log.info("%s: %.1f GB of weights loaded; KV cache %d tokens; capturing CUDA graphs", self.spec.name,
                     self.weights_bytes / 1e9, self._pool.capacity_tokens)  # fmt: skip
        with torch.no_grad(), self.on_stream():
            self._build_graphs()
        self.warmup_s = 0.0
        if c.warmup and warm.has_variants(self):
            tw = time.perf_counter()
            with torch.no_grad(), self.on_stream():
                warm.warm_eager(self, self.fwd)
            self.synchronize()
            self.warmup_s = time.perf_counter() - tw
        self.jit_cache_after_warmup = warm.jit_cache_entries()
        self.synchronize()
        self.startup_s = time.perf_counter() - t0

    def _setup_buffers(self) -> None:
        """KV cache, page table, token/output buffers and the forward for the current pool."""
        c, ps = self.config, self._pool.page_size
        if self._pool.num_pages * ps >= 2**31:
            raise ValueError("KV pool too large for int32 slot indices")
        limit = min(self.spec.max_position_embeddings, self._pool.capacity_tokens)
        self._max_context_len = min(c.max_context_len or limit, limit)
        slots = c.page_table_slots or 4 * c.max_batch_size + 1
        top = max(c.graph_buckets, default=0)
        self.varlen_shapes = None
        if c.varlen_buckets() and (c.cuda_graphs or c.graph_emulation):
            pad = c.varlen_max_pad_tokens
            pad = max_pad_tokens(self.spec.num_params, self.spec.num_layers) if pad is None else pad
            self.varlen_shapes = VarlenShapes.build(c.varlen_buckets(), max_rows=c.max_batch_size,
                                                    long_rows=c.varlen_long_rows, short_q=c.varlen_short_q,
                                                    page_size=ps, max_pad=pad)  # fmt: skip
        vrows = max((sh.rows for sh in self.varlen_shapes.shapes), default=0) if self.varlen_shapes else 0
        self.eager_out_base = top
        self.out_width = top + max(c.max_batch_size, vrows)
        with torch.no_grad(), self.on_stream():
            self.kv_cache = KVCache(self.spec, self._pool, device=self.device, dtype=self.dtype, tp=self.tp.size)
            self.table = PageTable(slots, -(-self._max_context_len // ps), self._pool.num_pages, self.device,
                                   shared_pages=c.shared_pages)  # fmt: skip
            self.slot_tokens = torch.zeros(slots, dtype=torch.int32, device=self.device)
            # tokens, destinations, then LOGPROB_WORDS per logit row for the rows that ask for log-probabilities
            self.out_ids = torch.zeros((2 + LOGPROB_WORDS) * self.out_width, dtype=torch.int32, device=self.device)
            rows = max(c.max_batch_size, top, c.max_num_batched_tokens, 1)
            fused = c.decode_fused_reduce or c.extend_fused_reduce or c.extend_split_keys > 0
            self.split_counters = (split_counters(rows, self.spec.num_kv_heads // self.tp.size, self.device)
                                    if fused and self.triton_attn else None)  # fmt: skip
        self.slot_token_step = [-1] * slots  # from_prev ledger (a list: cheap scalar access)
        self.fwd = StepForward(self)

    def _teardown_buffers(self) -> None:
        for name in ("kv_cache", "table", "slot_tokens", "out_ids", "split_counters", "fwd"):
            setattr(self, name, None)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _budget(self) -> int | None:
        c = self.config
        if c.memory_budget_bytes is not None:
            return c.memory_budget_bytes
        if c.gpu_memory_utilization is not None:
            total = self.mem.total()
            if total is None:
                raise ValueError("gpu_memory_utilization needs a CUDA device; use memory_budget_bytes on CPU")
            return int(c.gpu_memory_utilization * total)
        return None

    def _make_pool(self) -> KVPool:
        c = self.config
        per_page = kv_bytes_per_page(self.spec, c.page_size, self.dtype, self.tp.size)
        if self.budget is not None:
            prof = self.memory_profile = self._profile_memory()
            kv = kv_bytes_for_budget(self.budget, prof)
            # Every rank measured its own device; all take the smallest count, so page ids mean the same everywhere.
            pages = self.tp.min_int(max(0, kv) // per_page, self.device)
            if pages < 2:
                raise EngineError(f"{c.model}: memory budget {self.budget} B leaves no room for a KV cache after "
                                  f"weights {prof.weights} B, activations {prof.activation_peak} B "
                                  f"and buffers {prof.static} B")  # fmt: skip
            return KVPool(pages, c.page_size)
        if (c.kv_cache_bytes is None) == (c.num_pages is None):
            raise ValueError("set exactly one of EngineConfig.kv_cache_bytes, num_pages, memory_budget_bytes and "
                             "gpu_memory_utilization (or pass a KVPool)")  # fmt: skip
        pages = c.num_pages or max(2, c.kv_cache_bytes // per_page)  # at least the null page and one usable page
        return KVPool(pages, c.page_size)

    def _profile_memory(self) -> MemoryProfile:
        """`warmup.profile_memory` on buffers for a throwaway pool of a few pages (before the real KV cache)."""
        c = self.config
        _, q = warm.profile_pass_shape(c)
        self._pool = KVPool(2 + -(-q // c.page_size), c.page_size)  # rows read the null slot; width covers q
        self._setup_buffers()
        try:
            return warm.profile_memory(self, self.fwd, self.weights_bytes)
        finally:
            self._teardown_buffers()
            del self._pool

    def _attach_gemv(self) -> None:
        """The skinny GEMM state for graph steps, with the Triton ops (`config.triton_gemv`: whether it starts on)."""
        if not self.use_triton_ops:
            return
        c = self.config
        ops = importlib.import_module("tokenrouter.engine.triton_gemv")
        max_n = max(self.spec.hidden_size, self.model.layers[0].self_attn.qkv_proj.out_features,
                    2 * self.spec.intermediate_size) if len(self.model.layers) else 1  # fmt: skip
        state = GemvState(ops=ops, counters=ops.arrival_counters(max_n, self.device), enabled=c.triton_gemv,
                          max_rows=c.gemv_max_rows, varlen_max_rows=c.gemv_varlen_max_rows, pdl=self.pdl,
                          preload=c.gemv_preload, fold_norm=c.gemv_fold_norm, lm_head=c.gemv_lm_head,
                          late_norm_max_rows=c.gemv_late_norm_max_rows)  # fmt: skip
        self.model.attach_gemv(state)

    @property
    def gemv_enabled(self) -> bool:
        return self.model.gemv is not None and self.model.gemv.enabled

    def set_triton_gemv(self, enabled: bool, *, max_rows: int | None = None, prefetch: bool | None = None) -> None:
        """Ablations: switch the skinny GEMM of graph steps on/off (its row limit, L2 prefetch) and recapture."""
        g = self.model.gemv
        if g is None:
            raise ValueError("the skinny GEMM needs the Triton ops (CUDA, or ops_backend='triton')")
        g.enabled = enabled
        if max_rows is not None:
            if not 1 <= max_rows <= g.ops.MAX_ROWS:
                raise ValueError(f"max_rows must be in 1..{g.ops.MAX_ROWS}, got {max_rows}")
            g.max_rows = max_rows
        if prefetch is not None:
            g.prefetch = prefetch
        self.recapture()

    def set_router(self, router: DeviceRouter | None) -> None:
        """Run `router` (a router's device part) inside every step from now on; recaptures the graphs."""
        self.router = router
        self.recapture()

    def recapture(self) -> None:
        if self.followers is not None:  # every rank captures the same buckets in the same order
            g = self.model.gemv
            gemv = (g.enabled, g.max_rows, g.prefetch) if g is not None else None
            self.followers.publish(tp_step.encode(tp_step.Recapture(self.pdl, gemv)))
        self.synchronize()
        self._close_graphs()
        with torch.no_grad(), self.on_stream():
            self._build_graphs()
        self.synchronize()

    def _close_graphs(self) -> None:
        for name in ("graphs", "vgraphs"):
            g = getattr(self, name)
            if g is not None:
                g.close()
                setattr(self, name, None)

    def _build_graphs(self) -> None:
        """Decode and varlen graphs in one memory pool (one stream: never concurrent; kept outputs live in static
        buffers). Varlen graphs (largest activations) are captured first; the decode graphs reuse their memory."""
        c = self.config
        capture = c.cuda_graphs and self.device.type == "cuda"
        if not (capture or c.graph_emulation):
            return
        kw = {"hidden_size": self.spec.hidden_size, "vocab_size": self.spec.vocab_size, "device": self.device,
              "dtype": self.dtype, "stream": self.stream, "capture": capture}  # fmt: skip
        pool = torch.cuda.graph_pool_handle() if capture else None
        if self.varlen_shapes is not None:
            by_layout = {sh.layout: sh for sh in self.varlen_shapes.shapes}

            def body(packed, layout, out):
                self.fwd.varlen_body(packed, layout, out, by_layout[layout])

            self.vgraphs = GraphRunner(body, tuple(self.varlen_shapes.buckets), pool=pool,
                                       layouts={sh.tokens: sh.layout for sh in self.varlen_shapes.shapes},
                                       **kw)  # fmt: skip
        if c.graph_buckets:
            self.graphs = GraphRunner(self.fwd.graph_body, c.graph_buckets, pool=pool, **kw)
        try:
            self.faults.before_capture()
            self.synchronize()
            if capture:
                before = self.mem.reserved()
                for g in (self.vgraphs, self.graphs):
                    if g is not None:
                        g.capture_all()
                self.graph_pool_bytes = self.mem.reserved() - before
            self.capture_stats = {
                "decode_graphs": len(self.graphs.graphs) if self.graphs else 0,
                "varlen_graphs": len(self.vgraphs.graphs) if self.vgraphs else 0,
                "capture_s": sum(g.capture_s for g in (self.graphs, self.vgraphs) if g is not None),
            }
        except Exception as e:
            error = f"{type(e).__name__}: {e}".splitlines()[0]
            self._close_graphs()
            self._reset_device_state()
            if self.pdl:  # retry once without programmatic dependent launch (still graphs)
                log.warning("CUDA graph capture failed with PDL, retrying without it: %s", error)
                self.pdl_error = error
                self.set_pdl(False)
                self._build_graphs()
                return
            self.graph_error = error
            raise EngineError(f"CUDA graph capture failed ({error}); set cuda_graphs=False to run eagerly") from e

    def set_pdl(self, enabled: bool) -> None:
        """Programmatic dependent launch for later eager steps and graph captures."""
        self.synchronize()
        self.pdl = enabled
        self.model.set_pdl(enabled)
        self._reset_device_state()

    def _reset_device_state(self) -> None:
        if self.split_counters is not None:
            self.split_counters.zero_()  # a failed launch may have left a fused merge half-counted

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    # ---- ModelRunner interface ------------------------------------------------------------------------
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

    @property
    def graph_rule(self) -> GraphRule:
        """Which rows of a step run in a graph (the scheduler forms batches that fit it)."""
        on = self.graphs is not None and self.use_graphs
        rule = self._rules.get(on)
        if rule is None:  # once per setting (GraphRule sorts its buckets when built; the config never changes)
            rule = self._rules[on] = self.config.graph_rule(enabled=on)
        return rule

    def graph_bucket_for(self, batch: Batch) -> int | None:
        """The bucket when every row of `batch` runs in the graph part (benchmarks), else None."""
        rule = self.graph_rule
        g, e = rule.split([r.num_tokens for r in batch.rows])
        return None if e or not g else rule.bucket_for(sum(batch.rows[i].num_tokens for i in g))

    def plan_context(self) -> PlanContext:
        varlen = self.varlen_shapes if self.vgraphs is not None and self.use_graphs else None
        return PlanContext(self._pool.page_size, self._max_context_len, self.spec.vocab_size, self.graph_rule,
                           self.table, self.slot_token_step, self.eager_out_base, self._rng, varlen)  # fmt: skip

    @torch.no_grad()
    def step(self, batch: Batch, *, return_logits: bool = False, return_hidden: bool = False) -> StepHandle:
        """Launch one step. BatchError: nothing launched or changed. StepFailed: the launch failed, its rows count as
        failed, the engine stays usable (under tensor parallelism an EngineError: it is not; docs/engine.md, Safety)."""
        if self.closed:
            raise EngineError("engine is closed")
        if not self.tp.leader:
            raise EngineError(f"tensor-parallel rank {self.tp.rank} takes no batches: it follows rank 0")
        if len(batch.rows) > self.config.max_batch_size:
            raise BatchError(f"batch has {len(batch.rows)} rows, max_batch_size is {self.config.max_batch_size}")
        t0 = time.perf_counter()
        plan = plan_step(batch, self.plan_context(), self._staging_take)
        if self.followers is not None:
            self.followers.publish(tp_step.encode(tp_step.describe(batch.step_id, plan, self._staged.numpy())))
        t1 = time.perf_counter()
        handle = self._launch_or_fail(batch, plan, return_logits, return_hidden)
        self._commit_plan(plan, batch.step_id)
        handle.prepare_s, handle.launch_s = t1 - t0, time.perf_counter() - t1
        return handle

    def _launch_or_fail(self, batch: Batch, plan: StepPlan, want_logits: bool, want_hidden: bool) -> StepHandle:
        """Launch on the engine's stream; on failure forget the batch's slots (`_fail`), commit nothing and raise."""
        try:
            with self.on_stream():
                return self._launch(batch, plan, want_logits, want_hidden)
        except Exception as e:
            self._fail(plan)
            why = str(e).splitlines()[0] if str(e) else ""
            if self.tp.size > 1:
                raise EngineError(f"step {batch.step_id} failed on tensor-parallel rank 0 after its followers got "
                                  f"it ({type(e).__name__}: {why}); the ranks are out of step") from e  # fmt: skip
            raise StepFailed(f"step {batch.step_id} failed: {type(e).__name__}: {why}") from e

    def _commit_plan(self, plan: StepPlan, step_id: int) -> None:
        """After a launch: the page table takes the plan; every sampled slot records this step (from_prev ledger)."""
        self.table.commit(plan.table)
        ledger = self.slot_token_step
        for s in plan.sampled_slots:
            ledger[s] = step_id

    def _staging_take(self, g_size: int, e_size: int) -> np.ndarray:
        self._staged = self._staging.take(g_size + e_size)
        return self._staged.numpy()

    def _launch(self, batch: Batch, plan: StepPlan, want_logits: bool, want_hidden: bool) -> StepHandle:
        cuda = self.device.type == "cuda"
        start = end = None
        if self.timing and cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
        g_out, e_out, vg = self._run_passes(batch.step_id, plan.graph, plan.eager, bool(plan.logprobs))
        ev = plan.eager
        ring_i, host = self._ring.take()
        # One D2H copy; the log-probability region only when a row asked.
        n = self.out_ids.numel() if plan.logprobs else 2 * self.out_width
        host[:n].copy_(self.out_ids[:n], non_blocking=cuda)
        want = (want_logits or want_hidden) and plan.sampled
        extra = self.fwd.gather_sampled(plan, g_out, e_out, want_logits, want_hidden) if want else HostExtras()
        event = None
        if cuda:
            event = torch.cuda.Event(enable_timing=self.timing)
            event.record(self.stream)
            end = event if self.timing else None
        handle = StepHandle(batch, host.numpy(), event, plan.out_index, self.out_width, plan.sampled, plan.skipped,
                            extra, plan.logprobs)  # fmt: skip
        handle.destinations_on = self.router is not None
        handle.gpu_start, handle.gpu_end = start, end
        handle.num_tokens = plan.num_tokens
        handle.graph_bucket = plan.graph.bucket if plan.graph is not None else None
        handle.graph_rows = plan.graph.rows if plan.graph is not None else []
        handle.eager_tokens = sum(batch.rows[i].num_tokens for i in ev.rows) if ev is not None else 0
        handle.varlen_bucket = ev.bucket if vg is not None else None
        self._ring.bind(ring_i, handle)
        return handle

    def _fail(self, plan: StepPlan) -> None:
        """A launch failed: nothing of the batch may be trusted by a later step."""
        self.table.forget(plan.live_reqs)
        for req in plan.live_reqs:
            s = self.table.slot_of(req)
            if s is not None:
                self.slot_token_step[s] = -1
        with contextlib.suppress(Exception):
            self._reset_device_state()

    def _run_passes(self, step_id: int, graph: PartPlan | None, eager: PartPlan | None, logprobs: bool):
        """Upload `self._staged` (graph pass, then varlen pass) and run the passes; returns (graph outputs, varlen
        outputs, varlen graph runner or None). Every tensor-parallel rank runs exactly this for every step."""
        staged, fwd, g = self._staged, self.fwd, self.graphs
        g_out = e_out = e_dev = None
        vg = self.vgraphs if eager is not None and eager.bucket is not None else None
        if graph is not None:
            assert g is not None and graph.bucket is not None
            g.load(staged, graph.bucket)
            if graph.extra_upd is not None:
                fwd.table_writes(*graph.extra_upd)
        if eager is not None:
            off = graph.layout.size if graph is not None else 0
            part = staged[off : off + eager.layout.size]
            if vg is not None:
                vg.load(part, eager.bucket)
                if eager.extra_upd is not None:
                    fwd.table_writes(*eager.extra_upd)
            else:
                e_dev = part.to(self.device, non_blocking=True) if self.device.type == "cuda" else part.clone()
        self._staging.record(self.stream)
        fwd.logprobs_step = logprobs
        self.faults.before_passes(step_id)
        if graph is not None:
            g.run(graph.bucket)
            g_out = (g.out.hidden, g.out.logits)
        if vg is not None:
            vg.run(eager.bucket)
            e_out = (vg.out.hidden, vg.out.logits)
        elif eager is not None:
            e_out = fwd.eager_pass(e_dev, eager.layout, eager.max_q_len)
        return g_out, e_out, vg

    # ---- tensor-parallel followers ----------------------------------------------------------------------
    @torch.no_grad()
    def run_described(self, desc: tp_step.StepDesc) -> None:
        """A follower runs the step rank 0 described (`tp_step`); its outputs stay on its device."""
        if self.closed:
            raise EngineError("engine is closed")
        words = np.frombuffer(desc.packed, dtype="<i4")
        self._staged = self._staging.take(words.size)
        self._staged.numpy()[: words.size] = words
        graph = eager = None
        if desc.graph is not None:
            assert self.graphs is not None and desc.graph.bucket is not None, "rank 0 ran a graph this rank lacks"
            graph = PartPlan(self.graphs.layouts[desc.graph.bucket], words[:0], [], desc.graph.max_q_len,
                             desc.graph.bucket, tp_step.extra_updates(desc.graph))  # fmt: skip
        d = desc.eager
        if d is not None:
            if d.bucket is not None:
                assert self.vgraphs is not None, "rank 0 ran a varlen graph this rank lacks"
                layout = self.vgraphs.layouts[d.bucket]
            else:
                assert d.layout is not None
                layout = Layout(*d.layout, varlen=True)
            eager = PartPlan(layout, words[:0], [], d.max_q_len, d.bucket, tp_step.extra_updates(d))
        with self.on_stream():
            self._run_passes(desc.step_id, graph, eager, desc.logprobs)

    def apply_recapture(self, msg: tp_step.Recapture) -> None:
        """A follower takes rank 0's graph settings and recaptures, as rank 0 just did."""
        g = self.model.gemv
        if g is not None and msg.gemv is not None:
            g.enabled, g.max_rows, g.prefetch = msg.gemv
        if msg.pdl != self.pdl:
            self.set_pdl(msg.pdl)
        self.recapture()

    # ---- memory and shutdown --------------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        static = sum(g.nbytes for g in (self.graphs, self.vgraphs) if g is not None)
        return MemoryReport(
            device=str(self.device), budget=self.budget, weights=self.weights_bytes, kv_cache=self.kv_cache.nbytes,
            num_pages=self._pool.num_pages, page_table=self.table.nbytes, graph_static=static,
            decode_graphs=int(self.capture_stats["decode_graphs"]),
            varlen_graphs=int(self.capture_stats["varlen_graphs"]),
            graph_pool=getattr(self, "graph_pool_bytes", None),
            activation_peak=self.memory_profile.activation_peak if self.memory_profile else None,
            total_allocated=self.mem.allocated() if self.mem.cuda else None,
            total_reserved=self.mem.reserved() if self.mem.cuda else None, device_total=self.mem.total(),
        )  # fmt: skip

    def close(self) -> None:
        """Free everything this engine holds on its device; the engine is unusable afterwards."""
        if self.closed:
            return
        if self.followers is not None:  # they close their engines too, then end
            with contextlib.suppress(Exception):
                self.followers.publish(tp_step.encode(tp_step.Stop()))
            self.followers.close()
            self.followers = None
        self.synchronize()
        self.closed = True
        self._close_graphs()
        self.model = self._ring = self._staging = self._staged = self.router = None
        self.tp.close()
        self._teardown_buffers()
