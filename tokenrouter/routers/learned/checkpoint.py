"""Router checkpoints: R2R's released format, which our own CITER / Co-LLM heads use as well (docs/routers.md,
Learned routers). Files are read with `weights_only=True`: a checkpoint is data, never code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenrouter.routers.learned.r2r import R2R_INPUTS, R2RClassifier, r2r_embedding_dim
from tokenrouter.routers.learned.scorers import ConfidenceMLP, DeferralHead

OWN_MODEL_TYPES = {"ConfidenceMLP": ConfidenceMLP, "DeferralHead": DeferralHead}
MODEL_TYPES = (*R2R_INPUTS, *OWN_MODEL_TYPES)


@dataclass(slots=True)
class LoadedRouter:
    """A scorer built from a checkpoint; `threshold` is in the algorithm's units (None if not saved)."""

    scorer: nn.Module
    model_type: str
    threshold: float | None
    init_args: dict[str, Any] = field(default_factory=dict)
    common_args: dict[str, Any] = field(default_factory=dict)


def load_router_checkpoint(src: str | Path | Mapping[str, Any], *, device: torch.device | str = "cpu",
                           embedding: torch.Tensor | None = None) -> LoadedRouter:  # fmt: skip
    """Build the scorer a checkpoint describes and load its weights (strict: every key must match).

    `embedding`: the small model's input embedding table, used by reference when an R2R checkpoint omits
    `token_embeddings.weight` (R2R's default, trained with the embedding frozen)."""
    ckpt = src if isinstance(src, Mapping) else _read(Path(src))
    for key in ("model_type", "state_dict"):
        if key not in ckpt:
            raise ValueError(f"router checkpoint lacks {key!r} (keys: {', '.join(map(str, ckpt))})")
    model_type = str(ckpt["model_type"])
    init_args = dict(ckpt.get("init_args") or {})
    common = dict(ckpt.get("common_args") or {})
    state = {k: v for k, v in ckpt["state_dict"].items()}
    if model_type in OWN_MODEL_TYPES:
        scorer: nn.Module = OWN_MODEL_TYPES[model_type](**init_args, device=device)
    elif model_type in R2R_INPUTS:
        scorer = _build_r2r(model_type, init_args, state, device, embedding)
    else:
        raise ValueError(f"unknown router model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}")
    missing, unexpected = scorer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_type} checkpoint does not match: missing {missing}, unexpected {unexpected}")
    thr = common.get("threshold")
    return LoadedRouter(scorer, model_type, None if thr is None else float(thr), init_args, common)


def save_router_checkpoint(scorer: nn.Module, path: str | Path, threshold: float | None) -> None:
    """Write one of our own heads (`ConfidenceMLP`, `DeferralHead`) in the shared format."""
    name = type(scorer).__name__
    if name not in OWN_MODEL_TYPES:
        raise ValueError(f"save_router_checkpoint writes {', '.join(OWN_MODEL_TYPES)}, not {name}")
    common = {"threshold": None if threshold is None else float(threshold), "input_type": ["hidden_states"]}
    state = {k: v.detach().cpu() for k, v in scorer.state_dict().items()}
    torch.save({"model_type": name, "init_args": dict(scorer.init_args), "common_args": common, "state_dict": state},
               Path(path))  # fmt: skip


def _read(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        raise ValueError(f"router checkpoint {path} not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle with code in it, or not a torch file at all
        raise ValueError(f"cannot read router checkpoint {path} as plain tensors and values: {e}") from None
    if not isinstance(obj, Mapping):
        raise ValueError(f"router checkpoint {path} is a {type(obj).__name__}, not a dict")
    return obj


def _build_r2r(model_type: str, init_args: dict[str, Any], state: dict[str, torch.Tensor], device: torch.device | str,
               embedding: torch.Tensor | None) -> R2RClassifier:  # fmt: skip
    dim = r2r_embedding_dim(model_type, init_args, state)
    if dim is None:
        return R2RClassifier(model_type, init_args, device=device)
    own = state.get("token_embeddings.weight")
    if own is not None:
        return R2RClassifier(model_type, init_args, embedding_shape=tuple(own.shape), device=device)
    if embedding is None:
        raise ValueError(
            f"this {model_type} checkpoint has no token_embeddings.weight (R2R saves it without): pass the small "
            "model's input embedding table"
        )
    if embedding.shape[1] != dim:
        raise ValueError(f"checkpoint expects a {dim}-wide token embedding, the model's is {embedding.shape[1]}")
    return R2RClassifier(model_type, init_args, embedding=embedding, device=device)
