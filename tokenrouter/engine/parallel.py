"""Tensor parallelism of one engine (docs/tensor-parallel.md): its ranks' process group (`TensorParallel`, a c10d
backend on a store, never the default group, so two engines share a process) and a rank's shard of a full
checkpoint tensor (`Shard`)."""

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
    """Piece `index` of `parts` equal pieces of a full (tp=1) tensor along `dim` (0: column-, 1: row-parallel)."""

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
    """One engine's rank in its group (`group` None: one rank, collectives are no-ops); rank 0 leads."""

    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed ProcessGroupGloo / ProcessGroupNCCL, or None
    store: Any = None  # kept alive with the group

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place; on CUDA the wait only orders the stream (graph-capturable)."""
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
        """Join the group whose store rank 0 serves at `host:port` (`serve_store`; rank 0 passes it as `store`);
        blocks until all joined. gloo on CPU, NCCL on CUDA, set up here by one all-reduce (never in a capture)."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        if device.type == "cuda":
            # The one place NCCL's environment is set: every rank passes here before its communicator exists.
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
