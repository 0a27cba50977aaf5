"""Device parts (`DeviceRouter`s) of the learned routers, and threshold calibration for a target hop rate.
`ScoreGate` compares a scorer's per-row score with a threshold in a 0-d device buffer, which a captured CUDA graph
reads at replay, so calibration moves it in place (`set_threshold`) without recapturing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from tokenrouter.core.hop_law import check_prob


class ScoreGate(nn.Module):
    """Row goes to `hop` when its score passes the threshold (`hop_above`: exceeds it, else falls below; `inclusive`:
    equality passes), else to `stay`; int64 destinations, one per row."""

    def __init__(self, scorer: nn.Module, threshold: float, *, stay: int, hop: int, hop_above: bool = True,
                 inclusive: bool = False, device: torch.device | str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.scorer = scorer
        self.stay, self.hop = int(stay), int(hop)
        self.hop_above, self.inclusive = bool(hop_above), bool(inclusive)
        self.needs_hidden = bool(scorer.needs_hidden)
        self.needs_logits = bool(scorer.needs_logits)
        if device is None:
            device = next((p.device for p in scorer.parameters()), None) or _device_of(scorer)
        self.register_buffer("threshold", torch.tensor(float(threshold), dtype=torch.float32, device=device))

    def scores(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        return self.scorer(token_ids, hidden, logits)

    def decide(self, scores: torch.Tensor) -> torch.Tensor:
        t = self.threshold
        if self.hop_above:
            passed = scores >= t if self.inclusive else scores > t
        else:
            passed = scores <= t if self.inclusive else scores < t
        return self.stay + passed.to(torch.int64) * (self.hop - self.stay)

    def forward(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        return self.decide(self.scores(token_ids, hidden, logits))

    def set_threshold(self, value: float) -> None:
        """Move the cut in place (the buffer a captured graph reads)."""
        self.threshold.fill_(float(value))

    def calibrate(self, scores: torch.Tensor, hop_rate: float) -> float:
        """Set the threshold so that a fraction `hop_rate` of rows like `scores` would hop; returns it."""
        value = calibrate_threshold(scores, hop_rate, hop_above=self.hop_above)
        self.set_threshold(value)
        return value


class ConstantDestination(nn.Module):
    """Every row goes to `dst` (the large model's side of a one-token hand-back). Reads only the row count."""

    needs_hidden = False
    needs_logits = False

    def __init__(self, dst: int) -> None:
        super().__init__()
        self.dst = int(dst)

    def forward(self, token_ids: torch.Tensor, hidden: Any = None, logits: Any = None) -> torch.Tensor:
        return torch.full_like(token_ids, self.dst, dtype=torch.int64)


def calibrate_threshold(scores: torch.Tensor, hop_rate: float, *, hop_above: bool = True) -> float:
    """The threshold at which a fraction `hop_rate` of `scores` passes: the (1 - p) quantile when high scores hop,
    else the p quantile; p = 0 and p = 1 give infinite cuts, so the edge cases hold exactly."""
    p = check_prob(hop_rate, "hop rate")
    if p in (0.0, 1.0):
        never = math.inf if hop_above else -math.inf
        return never if p == 0.0 else -never
    s = scores.detach().reshape(-1).to("cpu", torch.float64)
    s = s[torch.isfinite(s)]
    if s.numel() == 0:
        raise ValueError("no finite scores to calibrate on")
    return float(torch.quantile(s, 1.0 - p if hop_above else p))


def _device_of(module: nn.Module) -> torch.device:
    buf = next(module.buffers(), None)
    return buf.device if buf is not None else torch.device("cpu")
