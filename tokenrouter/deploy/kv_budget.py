"""How many KV tokens each model of a deployment gets: the one place that decides memory splits.

Serving engines leave headroom: an engine may use `MEM_FRACTION` of its GPUs' memory for weights and KV.
"""

from __future__ import annotations

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.models import load_spec

# Fraction of GPU memory an engine may use (weights + KV), as serving engines leave headroom.
MEM_FRACTION = 0.9


def joint_kv_tokens(free_bytes: float, kv_bytes_per_token: list[int]) -> int:
    """Token capacity T that every co-located model gets when they split `free_bytes` of KV memory.

    Giving each model the same capacity (rather than the same bytes) keeps a request that fits on one
    model from being preempted on its peer: T * sum(kv_bytes_per_token) = free_bytes.
    """
    return max(0, int(free_bytes // max(1, sum(kv_bytes_per_token))))


def kv_capacity_tokens(dep: DeploymentConfig, gpu_memory_gb: float) -> list[int]:
    """Token capacity per model. Co-located models (mps) split the free memory so each gets the same
    capacity; a model on its own GPUs gets what its weights leave, unless `kv_budget_gb` is given.
    `gpu_memory_gb` is one GPU's memory (the profile's in the simulator, the device's at runtime)."""
    specs = [load_spec(m.name) for m in dep.models]
    gpu_bytes = gpu_memory_gb * 1e9 * MEM_FRACTION
    caps: list[int] = []
    for m, spec in zip(dep.models, specs, strict=True):
        if m.kv_budget_gb is not None:
            caps.append(int(m.kv_budget_gb * 1e9 // spec.kv_bytes_per_token))
        elif dep.placement.mode == "mps":
            sharing = [s for mm, s in zip(dep.models, specs, strict=True) if set(mm.gpus) & set(m.gpus)]
            free = gpu_bytes * len(m.gpus) - sum(
                s.weight_bytes / max(1, len(mm.gpus)) * len(m.gpus)
                for mm, s in zip(dep.models, specs, strict=True)
                if s in sharing
            )
            caps.append(joint_kv_tokens(free, [s.kv_bytes_per_token for s in sharing]))
        else:
            caps.append(int((gpu_bytes * len(m.gpus) - spec.weight_bytes) // spec.kv_bytes_per_token))
    for m, c in zip(dep.models, caps, strict=True):
        if c < dep.scheduler.page_size:
            raise ValueError(f"model {m.name}: no memory left for KV cache on its GPUs")
    return caps
