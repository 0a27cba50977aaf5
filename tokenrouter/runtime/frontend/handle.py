"""What the front-end needs to know about the running deployment: `ServerHandle`, implemented by the launcher. The
front-end never owns subserver processes, so tests can drive it with a fake backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tokenrouter.runtime.addresses import Addresses


@runtime_checkable
class ServerHandle(Protocol):
    """The deployment as the front-end sees it.

    Invariants:
    - `len(model_names) == len(kv_capacity_tokens) == len(addresses.subservers)`; index i is model i
      everywhere (the `model` field of `Tokens`/`Stats`/`Ready` uses the same index).
    - `entry` is the index of the subserver that receives `Submit`/`Abort` (`DeploymentConfig.entry`).
    - `kv_capacity_tokens[i]` is model i's KV pool in tokens; a prompt must fit every model's pool because a
      request may hop to any of them. A `Ready` event from model i overrides the value given here.
    - `max_context_len` and `vocab_size` hold for every model (the smallest over the models).
    - `is_alive(i)` is cheap and non-blocking (e.g. `Popen.poll() is None`); the front-end polls it a few
      times a second, so a dead process is noticed well within 5 s even if it never sent `Failed`.
    - `stop()` is idempotent; `serve_http` calls it once after uvicorn returns (SIGINT/SIGTERM).
    """

    addresses: Addresses
    entry: int
    model_names: Sequence[str]
    kv_capacity_tokens: Sequence[int]
    max_context_len: int
    vocab_size: int

    def is_alive(self, i: int) -> bool: ...

    def stop(self) -> None: ...
