"""`ModelRunner`: the boundary between a subserver and whatever executes its model (docs/engine.md, Why our own
engine); the scheduler allocates pages through the shared `KVPool`, a runner reads `req.pages` as the page table."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.kv import KVPool
from tokenrouter.models.spec import ModelSpec


class ModelRunner(ABC):
    """Executes one model's steps over a paged KV cache. `step` feeds each row's tokens at positions `row.start ..`,
    writes their KV into `req.pages` and returns one next token per row without a host sync the caller did not ask
    for; logits [rows, vocab] and last hidden states [rows, hidden] only when requested."""

    spec: ModelSpec

    @property
    @abstractmethod
    def kv_pool(self) -> KVPool:
        """The single page allocator shared with the scheduler."""

    @property
    def num_pages(self) -> int:
        return self.kv_pool.num_pages

    @property
    def page_size(self) -> int:
        return self.kv_pool.page_size

    @property
    @abstractmethod
    def max_batch_size(self) -> int:
        """Most rows one step accepts."""

    @property
    @abstractmethod
    def max_context_len(self) -> int:
        """Longest sequence (prompt + output) one row may reach."""

    @abstractmethod
    def step(self, batch: Batch, *, return_logits: bool = False, return_hidden: bool = False) -> StepResult:
        """Run one forward step over `batch` and sample one token per row."""

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release device memory (weights, KV, graphs); the runner is unusable afterwards."""
