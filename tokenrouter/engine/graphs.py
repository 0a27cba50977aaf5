"""CUDA-graph runner: static buffers and one graph per token bucket (docs/engine.md, What runs in CUDA graphs). A
step is one H2D copy into the static inputs and one replay; padding touches only the null page and slot. With
`capture=False` the same padded path runs eagerly (CPU tests, emulation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenrouter.engine.inputs import Layout, graph_layout


@dataclass(slots=True)
class GraphOutputs:
    hidden: torch.Tensor  # [max logit rows, hidden] final-norm hidden of each logit row
    logits: torch.Tensor  # [max logit rows, vocab] model dtype


ForwardFn = Callable[[torch.Tensor, Layout, GraphOutputs], None]


class GraphRunner:
    def __init__(self, forward: ForwardFn, buckets: tuple[int, ...], *, hidden_size: int, vocab_size: int,
                 device: torch.device, dtype: torch.dtype, stream: torch.cuda.Stream | None, capture: bool,
                 layouts: dict[int, Layout] | None = None, pool: tuple | None = None) -> None:  # fmt: skip
        """`forward(packed, layout, outputs)` is the body; `layouts`: bucket -> layout (default `graph_layout`);
        `pool`: a graph pool shared with a runner that never replays concurrently with this one."""
        if not buckets:
            raise ValueError("graph runner needs at least one bucket")
        self.forward = forward
        self.buckets = tuple(sorted(buckets))
        self.device = device
        self.stream = stream
        self.capture_enabled = capture
        self.layouts = layouts if layouts is not None else {b: graph_layout(b) for b in self.buckets}
        size = max(self.layouts[b].size for b in self.buckets)
        rows = max(self.layouts[b].num_logit_rows for b in self.buckets)
        self.packed = torch.zeros(size, dtype=torch.int32, device=device)
        self.out = GraphOutputs(hidden=torch.zeros(rows, hidden_size, device=device, dtype=dtype),
                                logits=torch.zeros(rows, vocab_size, device=device, dtype=dtype))  # fmt: skip
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = pool
        self.capture_s = 0.0

    @property
    def nbytes(self) -> int:
        """Static buffers (the graph pool's memory is counted by the engine's measurement)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.out.hidden, self.out.logits))

    def _fill_padding(self, bucket: int) -> None:
        """Make the static inputs an all-padding batch (see `inputs`)."""
        layout = self.layouts[bucket]
        self.packed.zero_()
        for name, value in (("seq_lens", 1), ("prev", -1)):
            off, n = layout.offsets()[name]
            self.packed[off : off + n] = value

    def run_eager(self, bucket: int) -> None:
        """The bucket's body on the static inputs, not replayed (emulation, capture warm-up, launch counting)."""
        layout = self.layouts[bucket]
        self.forward(self.packed[: layout.size], layout, self.out)

    @torch.no_grad()
    def capture_all(self) -> None:
        """Capture every bucket, largest first so smaller graphs reuse the pool's memory."""
        if not self.capture_enabled:
            return
        assert self.stream is not None
        t0 = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.stream(self.stream):
            for bucket in reversed(self.buckets):
                self._fill_padding(bucket)
                for _ in range(2):  # JIT-compile kernels and let cuBLAS pick algorithms before capture
                    self.run_eager(bucket)
                self.stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    self.run_eager(bucket)
                self.graphs[bucket] = graph
            self._fill_padding(self.buckets[0])
        self.stream.synchronize()
        self.capture_s = time.perf_counter() - t0

    def load(self, packed_host: torch.Tensor, bucket: int) -> None:
        """Upload one prepared step (int32, bucket layout) into the static buffer (async from pinned memory)."""
        n = self.layouts[bucket].size
        self.packed[:n].copy_(packed_host[:n], non_blocking=self.device.type == "cuda")

    def run(self, bucket: int) -> None:
        graph = self.graphs.get(bucket)
        if graph is not None:
            graph.replay()
        else:
            self.run_eager(bucket)

    def close(self) -> None:
        self.graphs.clear()
        self.pool = None
        self.packed = torch.empty(0)
        self.out = GraphOutputs(torch.empty(0), torch.empty(0))
