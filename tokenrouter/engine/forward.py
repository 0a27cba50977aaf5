"""`StepForward`: the device side of one pass of a step (graph bodies and the eager pass): prologue -> forward ->
logits -> sampling -> the router's device part. The graph part writes outputs at 0, the varlen part at
`eager_out_base`; each touches only its own requests' slots, so their order within a step does not matter."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from tokenrouter.engine.handles import HostExtras
from tokenrouter.engine.inputs import FLOAT_FIELDS, Layout
from tokenrouter.engine.metadata import AttentionMetadata
from tokenrouter.engine.sampler import LOGPROB_WORDS, MAX_LOGPROBS, sample_rows, token_logprobs

if TYPE_CHECKING:
    from tokenrouter.engine.graphs import GraphOutputs
    from tokenrouter.engine.step_plan import StepPlan
    from tokenrouter.engine.step_state import StepState
    from tokenrouter.engine.varlen_shapes import VarlenShape


class StepForward:
    """The passes of one engine; reads the engine's current state (`StepState`) at every pass."""

    def __init__(self, engine: StepState) -> None:
        self.e = engine
        self.ops = importlib.import_module("tokenrouter.engine.triton_step") if engine.use_triton_ops else None
        self.logprobs_step = False  # a row of this step asks for log-probabilities (read by the torch path on CUDA)

    @staticmethod
    def views(packed: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
        v = {name: packed[off : off + n] for name, (off, n) in layout.offsets().items()}
        for name in FLOAT_FIELDS:
            v[name] = v[name].view(torch.float32)
        return v

    # ---- passes ---------------------------------------------------------------------------------------
    def graph_body(self, packed: torch.Tensor, layout: Layout, out: GraphOutputs) -> None:
        """Everything a graph replays (also run eagerly in emulation); virtual-decode layout."""
        e = self.e
        with e.model.gemv_scope():
            v = self.views(packed, layout)
            self.prologue(v)
            n = layout.num_logit_rows
            hidden, logits = self.forward(v, layout, 1, out.hidden[:n], out.logits[:n])
            self.sample_route(v, hidden, logits, 0)

    def varlen_body(self, packed: torch.Tensor, layout: Layout, out: GraphOutputs, shape: VarlenShape) -> None:
        """What a varlen graph replays (or emulation runs): the eager pass at a padded shape, two attention groups."""
        with self.e.model.gemv_scope(varlen=True):
            v = self.views(packed, layout)
            self.prologue(v)
            n = layout.num_logit_rows
            hidden, logits = self.forward(v, layout, shape.tokens, out.hidden[:n], out.logits[:n],
                                          groups=(shape.long_rows, shape.short_q))  # fmt: skip
            self.sample_route(v, hidden, logits, self.e.eager_out_base)

    def eager_pass(self, packed: torch.Tensor, layout: Layout, max_q_len: int):
        """The rows outside the graph: one varlen forward; returns (hidden, logits) of its sampled rows."""
        v = self.views(packed, layout)
        self.prologue(v)
        if layout.num_logit_rows == 0:
            self.forward(v, layout, max_q_len, None, None, logits=False)
            return None
        hidden, logits = self.forward(v, layout, max_q_len, None, None)
        self.sample_route(v, hidden, logits, self.e.eager_out_base)
        return hidden, logits

    def forward(self, v, layout: Layout, max_q_len: int, out_hidden, out_logits, *, logits: bool = True,
                groups: tuple[int, int] | None = None):  # fmt: skip
        e = self.e
        c = e.config
        fuse = c.fuse_step_ops
        slots = v["slot_mapping"]
        meta = AttentionMetadata(slot_mapping=slots if fuse and e.use_triton_ops else slots.long(),
                                 block_tables=e.table.table, seq_lens=v["seq_lens"],
                                 cu_seqlens_q=v["cu_seqlens_q"] if layout.varlen else None, max_q_len=max_q_len,
                                 num_splits=c.decode_num_splits, backend=c.attention_backend,
                                 split_counters=e.split_counters if c.decode_fused_reduce else None,
                                 extend_counters=(e.split_counters if c.extend_fused_reduce or c.extend_split_keys
                                                  else None),
                                 short_split_keys=c.extend_split_keys, short_block_m=c.extend_short_block_m,
                                 short_split_programs=c.extend_split_programs,
                                 pdl=e.pdl, row_slots=v["row_slots"],
                                 fused_rope_rows=(c.graph_max_row_tokens if c.decode_fused_rope and e.use_triton_ops
                                                  else 0),
                                 long_rows=groups[0] if groups else None,
                                 short_q_len=groups[1] if groups else 1)  # fmt: skip
        model = e.model
        if not fuse:
            hidden = model(v["input_ids"], v["positions"], meta, e.kv_cache.layers)
            if not logits:
                return None
            h, lg = model.compute_logits(hidden.index_select(0, v["logits_indices"]))
            if out_hidden is not None:
                out_hidden.copy_(h)
                out_logits.copy_(lg)
                return out_hidden, out_logits
            return h, lg
        x, residual = model.forward_stream(v["input_ids"], v["positions"], meta, e.kv_cache.layers,
                                           fuse_embedding=e.use_triton_ops)  # fmt: skip
        if not logits:
            return None
        return model.compute_logits(x, residual, v["logits_indices"], out_hidden=out_hidden, out_logits=out_logits)

    # ---- step ends ------------------------------------------------------------------------------------
    def prologue(self, v: dict[str, torch.Tensor]) -> None:
        e = self.e
        if self.ops is not None:
            self.ops.step_prologue(e.table.table, v["upd_idx"], v["upd_val"], v["input_ids"], v["prev"],
                                   e.slot_tokens, pdl=e.pdl)  # fmt: skip
            return
        if v["upd_idx"].numel():
            e.table.table.view(-1).index_copy_(0, v["upd_idx"].long(), v["upd_val"])
        prev = v["prev"]
        taken = e.slot_tokens.index_select(0, prev.clamp(min=0).long())
        v["input_ids"].copy_(torch.where(prev >= 0, taken, v["input_ids"]))

    def sample_route(self, v, hidden: torch.Tensor, logits: torch.Tensor, base: int) -> None:
        e = self.e
        n = logits.shape[0]
        out = e.out_ids[base : base + n]
        lp0 = 2 * e.out_width + base * LOGPROB_WORDS  # this pass's rows of the log-probability region
        lp_out = e.out_ids[lp0 : lp0 + n * LOGPROB_WORDS]
        args = (v["inv_temp"], v["top_p"], v["top_k"], v["seed"], v["sample_pos"])
        if self.ops is not None:
            self.ops.sample(logits, *args, v["out_slot"], out, e.slot_tokens, v["logprobs_k1"], lp_out, pdl=e.pdl,
                            argmax_chunk=e.config.argmax_chunk)  # fmt: skip
        else:
            tok = sample_rows(logits, *args)
            out.copy_(tok)
            e.slot_tokens.index_copy_(0, v["out_slot"].long(), tok)
            self.logprobs_torch(logits, tok, v["logprobs_k1"], lp_out)
        r = e.router
        if r is not None:
            dst = r(out, hidden if r.needs_hidden else None, logits if r.needs_logits else None)
            w = e.out_width
            e.out_ids[w + base : w + base + n].copy_(dst)

    def logprobs_torch(self, logits: torch.Tensor, tok: torch.Tensor, k1: torch.Tensor, lp_out: torch.Tensor) -> None:
        """The torch path of the kernel's log-probabilities, laid out as the kernel does: on CPU the rows that ask;
        on CUDA (an ablation path) every row when the step asks or in a capture (a device mask would sync)."""
        if logits.device.type == "cpu":
            rows: torch.Tensor | None = (k1 > 0).nonzero().flatten()
            if rows.numel() == 0:
                return
        elif self.logprobs_step or torch.cuda.is_current_stream_capturing():
            rows = None
        else:
            return
        x, t = (logits, tok) if rows is None else (logits.index_select(0, rows), tok.index_select(0, rows))
        lp_tok, ids, vals = token_logprobs(x, t, MAX_LOGPROBS)
        block = torch.zeros(x.shape[0], LOGPROB_WORDS, dtype=torch.int32, device=x.device)
        k = ids.shape[1]
        block[:, 0] = lp_tok.view(torch.int32)
        block[:, 1 : 1 + k] = ids.to(torch.int32)
        block[:, 1 + MAX_LOGPROBS : 1 + MAX_LOGPROBS + k] = vals.contiguous().view(torch.int32)
        region = lp_out.view(-1, LOGPROB_WORDS)
        if rows is None:
            region.copy_(block)
        else:
            region.index_copy_(0, rows, block)

    def table_writes(self, idx: np.ndarray, val: np.ndarray) -> None:
        """Page-table writes beyond what a graph replay carries, before the replay."""
        t = self._to_device(np.stack([idx, val]).astype(np.int64))
        self.e.table.table.view(-1).index_copy_(0, t[0], t[1].to(torch.int32))

    def gather_sampled(self, plan: StepPlan, g_out, e_out, want_logits: bool, want_hidden: bool) -> HostExtras:
        """Logits (float32) and hidden states of the sampled rows, batch order, copied to the host."""
        e = self.e
        cuda = e.device.type == "cuda"
        base = e.eager_out_base
        n_graph = plan.graph.layout.num_logit_rows if plan.graph is not None else 0
        idx = np.asarray([int(plan.out_index[i]) for i in plan.sampled], np.int64)
        index = self._to_device(np.where(idx >= base, idx - base + n_graph, idx))

        def host_rows(k: int) -> torch.Tensor:  # k: 0 hidden, 1 logits (as float32)
            parts = ([g_out[k][:n_graph]] if g_out is not None else []) + ([e_out[k]] if e_out is not None else [])
            sel = (parts[0] if len(parts) == 1 else torch.cat(parts)).index_select(0, index)
            sel = sel.float() if k == 1 else sel
            return torch.empty(sel.shape, dtype=sel.dtype, pin_memory=cuda).copy_(sel, non_blocking=cuda)

        hidden = host_rows(0) if want_hidden else None
        return HostExtras(logits=host_rows(1) if want_logits else None, hidden=hidden)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        """A host array on the engine's device (async from pinned memory on CUDA)."""
        t = torch.from_numpy(a)
        return t.pin_memory().to(self.e.device, non_blocking=True) if self.e.device.type == "cuda" else t
