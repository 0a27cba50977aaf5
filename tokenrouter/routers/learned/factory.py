"""`make_learned_router`: what `tr serve --router NAME --router-model FILE|random` builds on each subserver
(without `--router-model` the runtime keeps the synthetic presets). What `model_file` may be: docs/routers.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from tokenrouter.core.hop_law import check_prob
from tokenrouter.core.names import RouterName
from tokenrouter.core.router import Router
from tokenrouter.routers.learned.checkpoint import load_router_checkpoint
from tokenrouter.routers.learned.ensemble import EnsembleRouter
from tokenrouter.routers.learned.r2r import R2R_INPUTS, R2RClassifier
from tokenrouter.routers.learned.routers import (
    LARGE,
    SMALL,
    CiterRouter,
    CoLLMRouter,
    R2RRouter,
    RStitchRouter,
)
from tokenrouter.routers.learned.score_gate import ScoreGate
from tokenrouter.routers.learned.scorers import ConfidenceMLP, DeferralHead, NormalizedEntropy

LEARNED_ROUTERS = tuple(r.value for r in RouterName if r not in (RouterName.MARKOV, RouterName.TRACE))
# R2R's published router shape for Qwen3 (resource/default_training_config_qwen3_*.json): used for `random`
# on real model sizes so the router's cost in the step is representative.
R2R_PUBLISHED_DIMS = (1024,) * 6
_GATE_RULE = {  # algorithm -> (router class, hop when the score is above the cut, equality hops)
    "r2r": (R2RRouter, True, True),  # critical probability >= threshold
    "citer": (CiterRouter, False, False),  # confidence < tau
    "co-llm": (CoLLMRouter, True, False),  # deferral probability > eta
}
_CHECKPOINT_TYPES = {"r2r": tuple(R2R_INPUTS), "citer": ("ConfidenceMLP",), "co-llm": ("DeferralHead",)}


def make_learned_router(name: str, model_file: str | Path | None, hop_rate: float = 0.1, hidden_size: int | None = None,
                        vocab_size: int | None = None, device: torch.device | str = "cpu", *, model: int | None = None,
                        num_models: int = 2, embedding: torch.Tensor | None = None, threshold: float | None = None,
                        return_prob: float | None = None, calibration_rows: int = 512, seed: int = 0,
                        ensemble_weights: Sequence[float] | None = None, ensemble_top_k: int = 16,
                        r2r_hidden_dims: Sequence[int] | None = None) -> Router:  # fmt: skip
    """Build a learned router for one subserver (`model`) or for all (`model=None`). `hidden_size`, `vocab_size`
    and `embedding` (its input table, shared by reference with R2R's token input) describe the small model.
    `threshold` is in the algorithm's units (a probability; R-Stitch: an entropy fraction); `return_prob`: the
    rate at which R-Stitch's large model hands back when calibrated."""
    key = name.lower()
    if key not in LEARNED_ROUTERS:
        raise ValueError(f"no learned router {name!r}; choose one of {', '.join(LEARNED_ROUTERS)}")
    is_random = str(model_file).lower() == "random" if model_file is not None else False
    if key == "me":
        if model_file is not None and not is_random:
            raise ValueError("the ensemble router has no weights file")
        return EnsembleRouter(num_models, ensemble_weights, ensemble_top_k, seed)
    if num_models != 2:
        raise ValueError(f"router {key!r} routes between 2 models, not {num_models}")
    check_prob(hop_rate, "hop rate")
    if key == RouterName.R_STITCH:
        return _r_stitch(model_file, is_random, hop_rate, return_prob, threshold, device, model, calibration_rows)
    cls, above, inclusive = _GATE_RULE[key]
    gate = None
    if model in (None, SMALL):
        if is_random:
            scorer = _random_scorer(key, hidden_size, vocab_size, embedding, seed, r2r_hidden_dims, device)
            cut = threshold
        elif model_file is not None:
            loaded = load_router_checkpoint(model_file, device=device, embedding=embedding)
            if loaded.model_type not in _CHECKPOINT_TYPES[key]:
                raise ValueError(f"{model_file}: a {loaded.model_type} checkpoint is not a {key} router")
            scorer, cut = loaded.scorer, threshold if threshold is not None else loaded.threshold
            if cut is None:
                raise ValueError(f"{model_file} saves no threshold; pass one")
            _check_hidden(scorer, hidden_size, model_file)
        else:
            raise ValueError(f"router {key!r} needs --router-model FILE or 'random'")
        # Uncalibrated random routers never hop until the warm-up sets the cut.
        score_cut = scorer.score_of_threshold(cut) if cut is not None else (float("inf") if above else float("-inf"))
        gate = ScoreGate(scorer, score_cut, stay=SMALL, hop=LARGE, hop_above=above, inclusive=inclusive, device=device)
    rate = hop_rate if is_random and threshold is None else None
    return cls(gate, hop_rate=rate, calibration_rows=calibration_rows)


def _r_stitch(model_file: str | Path | None, is_random: bool, hop_rate: float, return_prob: float | None,
              threshold: float | None, device: torch.device | str, model: int | None,
              calibration_rows: int) -> RStitchRouter:  # fmt: skip
    if model_file is not None and not is_random:
        raise ValueError("R-Stitch has no weights: pass a threshold (--router-threshold) or 'random'")
    if not is_random and threshold is None:
        raise ValueError("R-Stitch needs an entropy threshold tau in [0, 1], or 'random' to calibrate one")
    calibrate = is_random and threshold is None
    ent = NormalizedEntropy()
    # Until calibrated: the small model never hops, the large one always hands back.
    tau = float("inf") if calibrate else float(threshold)
    small = large = None
    if model in (None, SMALL):
        small = ScoreGate(ent, tau, stay=SMALL, hop=LARGE, hop_above=True, device=device)
    if model in (None, LARGE):
        large = ScoreGate(ent, tau, stay=LARGE, hop=SMALL, hop_above=False, inclusive=True, device=device)
    p = hop_rate if calibrate else None
    q = (1.0 if return_prob is None else return_prob) if calibrate else None
    return RStitchRouter(small, large, hop_rate=p, return_prob=q, calibration_rows=calibration_rows)


def _random_scorer(key: str, hidden_size: int | None, vocab_size: int | None, embedding: torch.Tensor | None, seed: int,
                   r2r_dims: Sequence[int] | None, device: torch.device | str) -> nn.Module:  # fmt: skip
    if not hidden_size:
        raise ValueError("a random learned router needs the small model's hidden_size")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if key == "citer":
            scorer: nn.Module = ConfidenceMLP(hidden_size)
        elif key == "co-llm":
            scorer = DeferralHead(hidden_size)
        else:
            if embedding is None and not vocab_size:
                raise ValueError("a random R2R router needs the small model's embedding table or vocab_size")
            dims = list(r2r_dims or (R2R_PUBLISHED_DIMS if hidden_size >= 1024 else (hidden_size, hidden_size)))
            vocab = embedding.shape[0] if embedding is not None else int(vocab_size)
            init = {"hidden_states_size": hidden_size, "logits_size": min(100, vocab), "hidden_dims": dims}
            kind = "HiddenStatesTokenLMHeadLogitsClassifier"
            if embedding is not None:  # shared by reference: a plain attribute, untouched by .to() below
                scorer = R2RClassifier(kind, init, embedding=embedding)
            else:
                scorer = R2RClassifier(kind, init, embedding_shape=(vocab, hidden_size))
            for m in scorer.modules():  # R2R's initialization: Kaiming-normal weights, zero biases
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight)
                    nn.init.zeros_(m.bias)
    return scorer.to(device)


def _check_hidden(scorer: nn.Module, hidden_size: int | None, path: str | Path) -> None:
    want = getattr(scorer, "hidden_size", None) or getattr(scorer, "init_args", {}).get("hidden_size")
    if hidden_size and want and int(want) != int(hidden_size):
        raise ValueError(f"{path}: router reads hidden states of width {want}, the small model's is {hidden_size}")
