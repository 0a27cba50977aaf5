"""How many KV tokens each model of a deployment gets: the one place that decides memory splits."""

from __future__ import annotations

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.models import load_spec
from tokenrouter.models.spec import ModelSpec

# Fraction of GPU memory an engine may use (weights + KV), as serving engines leave headroom.
MEM_FRACTION = 0.9


def kv_room_gb(gpu_memory_gb: float, weight_bytes: float, tp: int = 1) -> float:
    """GB of KV memory a model alone on its GPUs has on each: `MEM_FRACTION` of one GPU's memory less its share of
    the weights (negative: its weights do not fit)."""
    return gpu_memory_gb * MEM_FRACTION - weight_bytes / max(1, tp) / 1e9


class NoRoom(ValueError):
    """A model gets less than one KV page: its weights (or its GPU neighbours' with them) leave no room."""


def kv_capacity_tokens(dep: DeploymentConfig, gpu_memory_gb: float) -> list[int]:
    """Token capacity per model: co-located models (mps) split the free memory for the same capacity, a model on its
    own GPUs gets what its weights leave, unless `kv_budget_gb` is given. `gpu_memory_gb`: one GPU's memory."""
    specs = [load_spec(m.name) for m in dep.models]
    gpu_bytes = gpu_memory_gb * 1e9 * MEM_FRACTION
    caps: list[int] = []
    for m, spec in zip(dep.models, specs, strict=True):
        if m.kv_budget_gb is not None:
            caps.append(int(m.kv_budget_gb * 1e9 // spec.kv_bytes_per_token))
        elif dep.placement.mode == "mps":
            # The same token capacity T for every co-located model (not the same bytes), so a request that fits one
            # model is not preempted on its peer: T * sum(kv_bytes_per_token) = free bytes.
            sharing = [s for mm, s in zip(dep.models, specs, strict=True) if set(mm.gpus) & set(m.gpus)]
            weights = [
                s.weight_bytes / max(1, len(mm.gpus)) for mm, s in zip(dep.models, specs, strict=True) if s in sharing
            ]
            free = gpu_bytes * len(m.gpus) - sum(w * len(m.gpus) for w in weights)
            caps.append(max(0, int(free // max(1, sum(s.kv_bytes_per_token for s in sharing)))))
        else:
            caps.append(int((gpu_bytes * len(m.gpus) - spec.weight_bytes) // spec.kv_bytes_per_token))
    if any(c < dep.scheduler.page_size for c in caps):
        raise NoRoom(_no_room(dep, specs, caps, gpu_memory_gb))
    return caps


def _no_room(dep: DeploymentConfig, specs: list[ModelSpec], caps: list[int], gpu_memory_gb: float) -> str:
    """Why a model gets less than one KV page, naming the model whose weights do not fit (not a neighbour that
    merely shares its GPU) and the numbers."""
    usable = gpu_memory_gb * MEM_FRACTION
    of = f"of the {usable:.1f} GB an engine may use on a {gpu_memory_gb:g} GB GPU ({MEM_FRACTION:.0%})"
    per_gpu = [s.weight_bytes / 1e9 / len(m.gpus) for m, s in zip(dep.models, specs, strict=True)]
    alone = [i for i, w in enumerate(per_gpu) if w >= usable]
    if alone:
        i = alone[0]
        m = dep.models[i]
        tp = f" (tp={m.tp}: {per_gpu[i]:.1f} GB per GPU)" if len(m.gpus) > 1 else ""
        return (f"{m.name} does not fit: its weights take {specs[i].weight_bytes / 1e9:.1f} GB{tp}, more than all "
                f"{of}; give it more GPUs (--tp) or a GPU with more memory")  # fmt: skip
    i = next(i for i, c in enumerate(caps) if c < dep.scheduler.page_size)
    gpu = dep.models[i].gpus[0]
    on = [j for j, m in enumerate(dep.models) if gpu in m.gpus] if dep.placement.mode == "mps" else [i]
    weights = " + ".join(f"{dep.models[j].name} {per_gpu[j]:.1f} GB" for j in on)
    return (f"{' and '.join(dep.models[j].name for j in on)} leave no room for a KV cache on GPU {gpu}: weights "
            f"({weights}) take {sum(per_gpu[j] for j in on):.1f} GB {of}")  # fmt: skip
