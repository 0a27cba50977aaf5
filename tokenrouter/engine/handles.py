"""Host buffers of a step and its completion handle (docs/engine.md, Steps and handles)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenrouter.core.batch import Batch, StepResult, TokenLogprobs
from tokenrouter.engine.sampler import LOGPROB_WORDS, MAX_LOGPROBS


class Staging:
    """Two alternating host input buffers (pinned on CUDA), each rewritten only after the copies that read it."""

    def __init__(self, pinned: bool, capacity: int = 1 << 16) -> None:
        self.pinned = pinned
        self.bufs = [self._alloc(capacity), self._alloc(capacity)]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.i = 0

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int32, pin_memory=self.pinned)

    def take(self, size: int) -> torch.Tensor:
        self.i ^= 1
        ev = self.events[self.i]
        if ev is not None:
            ev.synchronize()
            self.events[self.i] = None
        if self.bufs[self.i].numel() < size:
            self.bufs[self.i] = self._alloc(max(size, 2 * self.bufs[self.i].numel()))
        return self.bufs[self.i]

    def record(self, stream: torch.cuda.Stream | None) -> None:
        if self.pinned and stream is not None:
            ev = torch.cuda.Event()
            ev.record(stream)
            self.events[self.i] = ev


@dataclass(slots=True)
class HostExtras:
    """Logits and hidden states copied to the host, when asked."""

    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class StepHandle:
    """Completion of one step: `ready()` polls, `wait()` blocks on its event only, `result()`: the `StepResult`."""

    __slots__ = ("_cache", "_event", "_extra", "_host", "_ring_slot", "batch", "destinations_on", "eager_tokens",
                 "gpu_end", "gpu_start", "graph_bucket", "graph_rows", "launch_s", "logprob_rows", "num_tokens",
                 "out_index", "prepare_s", "sampled_rows", "skipped_rows", "varlen_bucket")  # fmt: skip

    def __init__(self, batch: Batch, host: np.ndarray, event: torch.cuda.Event | None, out_index: np.ndarray,
                 out_width: int, sampled: list[int], skipped: list[int], extra: HostExtras,
                 logprob_rows: list[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.batch = batch
        # pinned int32: tokens [out_width], destinations [out_width], log-probabilities [out_width, LOGPROB_WORDS]
        self._host = host
        self._event = event
        self.out_index = out_index
        self._ring_slot = out_width
        self.sampled_rows = sampled
        self.skipped_rows = skipped
        self._extra = extra
        self.logprob_rows = logprob_rows or []  # (batch row, k) of the sampled rows that ask
        self._cache: StepResult | None = None
        self.destinations_on = False
        self.gpu_start: torch.cuda.Event | None = None
        self.gpu_end: torch.cuda.Event | None = None
        self.prepare_s = self.launch_s = 0.0
        self.num_tokens = 0
        self.graph_bucket: int | None = None
        self.graph_rows: list[int] = []  # batch rows that ran in the graph part
        self.eager_tokens = 0  # tokens of the varlen part (in a varlen graph or eager)
        self.varlen_bucket: int | None = None  # the varlen graph that ran the varlen part, None: eager or none

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def result(self) -> StepResult:
        if self._cache is None:
            self.wait()
            idx = self.out_index
            live = idx >= 0
            host = self._host
            width = self._ring_slot
            toks = np.full(idx.size, -1, np.int64)
            toks[live] = host[idx[live]]
            dests = None
            if self.destinations_on:
                dests = np.full(idx.size, self.batch.model, np.int64)
                dests[live] = host[width + idx[live]]
                dests = torch.from_numpy(dests)
            e = self._extra
            rows = self.sampled_rows if (e.logits is not None or e.hidden is not None) else None
            self._cache = StepResult(next_token_ids=torch.from_numpy(toks), logits=e.logits, hidden=e.hidden,
                                     destinations=dests, logit_rows=rows, logprobs=self._logprobs())  # fmt: skip
            self._host = None  # the ring slot may be reused
        return self._cache

    def _logprobs(self) -> list[TokenLogprobs | None] | None:
        if not self.logprob_rows:
            return None
        region = self._host[2 * self._ring_slot :]
        values = region.view(np.float32)
        out: list[TokenLogprobs | None] = [None] * self.out_index.size
        top = 1 + MAX_LOGPROBS
        for i, k in self.logprob_rows:
            o = int(self.out_index[i]) * LOGPROB_WORDS
            ids = region[o + 1 : o + 1 + k].tolist()
            vals = values[o + top : o + top + k].tolist()
            out[i] = TokenLogprobs(float(values[o]), tuple(zip(ids, vals, strict=True)))
        return out

    @property
    def holds_ring_slot(self) -> bool:
        return self._host is not None


class OutputRing:
    """Pinned slots of `size` int32 words receiving each step's outputs; a slot is reused after its handle read it."""

    def __init__(self, size: int, pinned: bool, slots: int = 4) -> None:
        self.bufs = [torch.zeros(size, dtype=torch.int32, pin_memory=pinned) for _ in range(slots)]
        self.owner: list[StepHandle | None] = [None] * slots
        self.i = 0

    def take(self) -> tuple[int, torch.Tensor]:
        self.i = (self.i + 1) % len(self.bufs)
        h = self.owner[self.i]
        if h is not None and h.holds_ring_slot:
            h.result()  # read it out before the slot is overwritten
        self.owner[self.i] = None
        return self.i, self.bufs[self.i]

    def bind(self, i: int, handle: StepHandle) -> None:
        self.owner[i] = handle
