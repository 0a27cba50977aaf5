"""`ServerHandle`: what the front-end knows of the deployment (the launcher implements it; tests fake it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tokenrouter.runtime.addresses import Addresses


@runtime_checkable
class ServerHandle(Protocol):
    """Invariants: index i is model i everywhere; a `Ready` from model i overrides `kv_capacity_tokens[i]`;
    `max_context_len` and `vocab_size` are the smallest over the models; `is_alive(i)` is cheap and non-blocking
    (polled a few times a second); `stop()` is idempotent."""

    addresses: Addresses
    entry: int
    model_names: Sequence[str]
    kv_capacity_tokens: Sequence[int]
    max_context_len: int
    vocab_size: int

    def is_alive(self, i: int) -> bool: ...

    def stop(self) -> None: ...
