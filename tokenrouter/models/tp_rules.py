"""What holds for a tensor-parallel model in every process: the degrees its shape splits by and the NCCL settings
its ranks run with. Pure (no torch): the launcher and the placement checks read it as the engine does."""

from __future__ import annotations

from tokenrouter.models.spec import ModelSpec

# NVLink multicast (NVLS) stays off in every process of a tensor-parallel model (see docs/tensor-parallel.md).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def tp_split_error(spec: ModelSpec, tp: int) -> str | None:
    """Why `tp` ranks cannot split the model's heads and MLP evenly (one line), or None when they can."""
    if tp < 1:
        return f"tensor-parallel size must be >= 1, got {tp}"
    for what, n in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads),
                    ("MLP intermediate size", spec.intermediate_size)):  # fmt: skip
        if n % tp:
            return (f"tp={tp} does not divide its {n} {what}; use a tp that divides {spec.num_heads} attention "
                    f"heads and {spec.num_kv_heads} KV heads")  # fmt: skip
    return None
