"""R2R's router network (Roads to Rome, thu-nics/R2R), rebuilt so its released checkpoints load unchanged (format:
docs/routers.md#learned-routers). The module names below are the checkpoint's state_dict keys: never rename them.

Inputs (as R2R's serving code prepares them): the small model's final-norm hidden state of the row, the token it
just sampled, and the `logits_size` largest raw logits in descending order, all in float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenrouter.routers.learned.scorers import logit

# Class defaults of R2R's classifiers (only explicitly passed arguments are saved in init_args).
R2R_DEFAULTS: dict[str, Any] = {
    "hidden_states_size": 1536,
    "logits_size": 100,
    "hidden_dims": [256, 512, 256],
    "expansion_factor": 4,
    "use_position_embedding": False,
    "normalize_input": False,
    "output_dim": 1,
}

# model_type -> which inputs the classifier reads (in concatenation order)
R2R_INPUTS: dict[str, tuple[str, ...]] = {
    "HiddenStatesTokenLMHeadLogitsClassifier": ("hidden_states", "token", "logits"),
    "HiddenStatesTokenLMHeadClassifier": ("hidden_states", "token"),
    "HiddenStatesLogitsClassifier": ("hidden_states", "logits"),
    "HiddenStatesClassifier": ("hidden_states",),
    "LogitsClassifier": ("logits",),
}
# The single-input classes project straight to the backbone width and may have several output classes
# (then class 2, "divergent", is the critical one); the combined ones have one output logit.
_SINGLE_INPUT = {"HiddenStatesClassifier": "hidden_states_projection", "LogitsClassifier": "logits_projection"}


class _Block(nn.Module):
    """Pre-norm residual MLP block; `mlp` keeps R2R's layout (Linear, GELU, dropout, Linear, dropout) so the
    weights sit at indices 0 and 3; dropout is an identity at inference."""

    def __init__(self, d_in: int, d_out: int, expansion: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_in)
        wide = d_in * expansion
        self.mlp = nn.Sequential(nn.Linear(d_in, wide), nn.GELU(), nn.Identity(), nn.Linear(wide, d_out), nn.Identity())
        self.dim_change = nn.Linear(d_in, d_out) if d_in != d_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dim_change(x) + self.mlp(self.layer_norm(x))


class _Backbone(nn.Module):
    def __init__(self, width: int, dims: Sequence[int], expansion: int, out: int) -> None:
        super().__init__()
        self.input_projection = nn.Linear(width, dims[0])
        chain = [*dims, dims[-1]]
        self.blocks = nn.ModuleList(_Block(chain[i], chain[i + 1], expansion) for i in range(len(dims)))
        self.output_layer = nn.Sequential(nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_projection(x)
        for block in self.blocks:
            x = block(x)
        return self.output_layer(x)


class R2RClassifier(nn.Module):
    """One of R2R's classifiers (by `model_type`), scoring rows for the ScoreGate: the output logit (binary head) or
    the log-probability of class 2 (multi-class), monotone in R2R's critical probability (`score_of_threshold`)."""

    needs_hidden: bool
    needs_logits: bool

    def __init__(self, model_type: str, init_args: Mapping[str, Any], *, embedding: torch.Tensor | None = None,
                 embedding_shape: tuple[int, int] | None = None,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        super().__init__()
        if model_type not in R2R_INPUTS:
            raise ValueError(f"unsupported R2R model_type {model_type!r}; supported: {', '.join(R2R_INPUTS)}")
        a = {**R2R_DEFAULTS, **{k: v for k, v in init_args.items() if k in R2R_DEFAULTS}}
        if a["use_position_embedding"]:
            raise ValueError("R2R routers with use_position_embedding=True are not supported (R2R serves without)")
        self.model_type = model_type
        self.inputs = R2R_INPUTS[model_type]
        self.needs_hidden = "hidden_states" in self.inputs
        self.needs_logits = "logits" in self.inputs
        self.normalize = bool(a["normalize_input"])
        self.topk = int(a["logits_size"])
        h, dims, exp = int(a["hidden_states_size"]), [int(d) for d in a["hidden_dims"]], int(a["expansion_factor"])
        self.hidden_size = h
        out = int(a["output_dim"]) if model_type in _SINGLE_INPUT else 1
        self.num_outputs = out
        self._shared_embedding: torch.Tensor | None = None
        self._hidden_norm: str | None = None  # R2R names the hidden-state LayerNorm differently per class
        with torch.device(device):
            if model_type in _SINGLE_INPUT:
                src = h if self.needs_hidden else self.topk
                if self.normalize and self.needs_hidden:
                    self._hidden_norm = "layer_norm"
                    self.layer_norm = nn.LayerNorm(h)
                setattr(self, _SINGLE_INPUT[model_type], nn.Linear(src, dims[0]))
            else:
                width = h
                if self.normalize:
                    self._hidden_norm = "layer_norm_hidden_states"
                    self.layer_norm_hidden_states = nn.LayerNorm(h)
                if "token" in self.inputs:
                    if embedding is not None:
                        self._shared_embedding = embedding  # the engine's table, by reference
                        vocab, e = embedding.shape
                    elif embedding_shape is not None:
                        vocab, e = embedding_shape
                        self.token_embeddings = nn.Embedding(vocab, e)
                    else:
                        raise ValueError(f"{model_type} needs the small model's token embedding (or its shape)")
                    if self.normalize:
                        self.layer_norm_token = nn.LayerNorm(h)
                    width += e
                if "logits" in self.inputs:
                    self.logits_projection = nn.Linear(self.topk, h)
                    width += h
                self.combined_projection = nn.Linear(width, dims[0])
            self.backbone = _Backbone(dims[0], dims, exp, out)
        self.requires_grad_(False)
        self.eval()

    @property
    def embedding_weight(self) -> torch.Tensor | None:
        if self._shared_embedding is not None:
            return self._shared_embedding
        emb = getattr(self, "token_embeddings", None)
        return emb.weight if emb is not None else None

    def forward(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        feats = []
        if self.needs_hidden:
            x = hidden.float()
            feats.append(getattr(self, self._hidden_norm)(x) if self._hidden_norm else x)
        if "token" in self.inputs:
            table = self.embedding_weight
            ids = token_ids.long().clamp(0, table.shape[0] - 1)  # graph padding rows may hold anything
            emb = F.embedding(ids, table).float()
            feats.append(self.layer_norm_token(emb) if self.normalize else emb)
        if self.needs_logits:
            top = torch.topk(logits.float(), self.topk, dim=-1).values
            feats.append(torch.softmax(top, dim=-1) if self.normalize else top)
        if self.model_type in _SINGLE_INPUT:
            x = getattr(self, _SINGLE_INPUT[self.model_type])(feats[0])
        else:
            if "logits" in self.inputs:
                feats[-1] = self.logits_projection(feats[-1])
            x = self.combined_projection(torch.cat(feats, dim=-1))
        out = self.backbone(x)
        if self.num_outputs == 1:
            return out.squeeze(-1)
        return torch.log_softmax(out, dim=-1)[:, 2]

    def score_of_threshold(self, p: float) -> float:
        """R2R's rule is `critical probability >= p`; the same cut in score space."""
        if self.num_outputs == 1:
            return logit(p)
        return -math.inf if p <= 0 else math.inf if p >= 1 else math.log(p)


def r2r_embedding_dim(model_type: str, init_args: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> int | None:
    """Width of the token embedding a checkpoint was trained with (from `combined_projection`), or None
    when the classifier reads no token."""
    if "token" not in R2R_INPUTS.get(model_type, ()):
        return None
    w = state.get("combined_projection.weight")
    if w is None:
        raise ValueError(f"{model_type} checkpoint has no combined_projection.weight")
    h = int(init_args.get("hidden_states_size", R2R_DEFAULTS["hidden_states_size"]))
    return int(w.shape[1]) - h - (h if "logits" in R2R_INPUTS[model_type] else 0)
