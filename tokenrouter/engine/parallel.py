"""Tensor parallelism of one engine (docs/tensor-parallel.md): its ranks' process group (`TensorParallel`) and how
a full checkpoint tensor maps onto one rank's shard (`Shard`).

Megatron-style: q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel and all-reduced; embedding,
LM head, norms and RoPE replicated, row-parallel biases added on rank 0 only, so everything after the last
all-reduce computes the same values on every rank. No module-level state: the group is a c10d backend built on a
store (gloo on CPU, NCCL on CUDA), never `torch.distributed`'s default group, so two engines share a process.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch

from tokenrouter.engine.errors import ModelLoadError
from tokenrouter.models.spec import ModelSpec
from tokenrouter.models.tp_rules import NCCL_ENV, tp_split_error


def check_divides(spec: ModelSpec, size: int) -> None:
    """Refuse a tensor-parallel size that does not split the model's heads and MLP evenly (one line naming why)."""
    why = tp_split_error(spec, size)
    if why is not None:
        raise ModelLoadError(f"{spec.name}: {why}")


@dataclass(frozen=True, slots=True)
class Shard:
    """This rank's piece of a full (tp=1) checkpoint tensor: `parts` equal pieces along `dim` (0: output rows of a
    column-parallel layer; 1: input columns of a row-parallel one), piece `index`."""

    dim: int
    parts: int
    index: int

    def take(self, full: torch.Tensor) -> torch.Tensor:
        n = full.shape[self.dim] // self.parts
        return full.narrow(self.dim, self.index * n, n)

    def bounds(self, full_len: int) -> tuple[int, int]:
        n = full_len // self.parts
        return self.index * n, (self.index + 1) * n


@dataclass(eq=False, slots=True)
class TensorParallel:
    """One engine's rank in its tensor-parallel group. `group` is None for a single rank (every collective is then
    a no-op), else a c10d backend spanning exactly the engine's ranks; rank 0 leads (schedules, samples for real)."""

    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed ProcessGroupGloo / ProcessGroupNCCL, or None
    store: Any = None  # kept alive with the group

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns `x`. On CUDA the wait only orders the current stream after the
        collective (no host sync), so it may sit inside a captured CUDA graph."""
        if self.group is not None:
            self.group.allreduce([x]).wait()
        return x

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's `value` (start-up only: a host sync)."""
        if self.group is None:
            return value
        from torch.distributed import AllreduceOptions, ReduceOp

        t = torch.tensor([value], dtype=torch.int64, device=device)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.MIN
        self.group.allreduce([t], opts).wait()
        return int(t.item())

    def shard(self, dim: int) -> Shard | None:
        return Shard(dim, self.size, self.rank) if self.size > 1 else None

    def close(self) -> None:
        """Drop the group. NCCL communicators are aborted rather than destroyed: a destroy after CUDA-graph capture
        of collectives can hang (pytorch/pytorch#115388)."""
        g, self.group = self.group, None
        self.store = None
        if g is not None and getattr(g, "name", lambda: "")() == "nccl":
            abort = getattr(g, "abort", None)
            if abort is not None:
                abort()

    @staticmethod
    def connect(rank: int, size: int, host: str, port: int, device: torch.device, *, store: Any = None,
                timeout_s: float = 300.0) -> TensorParallel:  # fmt: skip
        """Join the group whose store rank 0 serves at `host:port` (`serve_store`; rank 0 passes that store as
        `store`). Blocks until every rank has joined. gloo on CPU, NCCL (NVLS off) on CUDA; the NCCL communicator
        is set up here by one all-reduce, so CUDA-graph capture never creates it."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        if device.type == "cuda":
            # The one place NCCL's environment is set: every rank, whichever way it started, passes here
            # before its communicator exists (NCCL reads it then).
            os.environ.update(NCCL_ENV)
            torch.cuda.set_device(device)
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            group: Any = dist.ProcessGroupNCCL(store, rank, size, opts)
        else:
            opts = dist.ProcessGroupGloo._Options()
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            opts._timeout = timeout
            group = dist.ProcessGroupGloo(store, rank, size, opts)
        tp = TensorParallel(rank, size, group, store)
        probe = torch.ones(1, device=device)
        tp.all_reduce(probe)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if int(probe.item()) != size:
            raise RuntimeError(f"tensor-parallel group check failed: all-reduce of ones gave {probe.item()}")
        return tp


def serve_store(size: int, host: str = "127.0.0.1", timeout_s: float = 300.0) -> Any:
    """Rank 0's rendezvous store on a free port (`store.port`); ranks join it with `TensorParallel.connect`."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, size, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
