"""Per-row signals of the learned routers other than R2R: CITER's confidence MLP, Co-LLM's deferral head,
R-Stitch's normalized entropy. A scorer is called as `scorer(token_ids, hidden, logits) -> float32 [rows]`, names
its inputs (`needs_hidden`, `needs_logits`) and maps a threshold into score space (`score_of_threshold`); scores stay
in logit space where the algorithm uses a sigmoid, so saturated probabilities cannot tie. Graph-capturable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


def logit(p: float) -> float:
    """The score cut equivalent to `sigmoid(score) ? p` (infinite at 0 and 1)."""
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))


class _HiddenStateScorer(nn.Module):
    """A scorer over the small model's final hidden state whose sigmoid is the algorithm's probability."""

    needs_hidden = True
    needs_logits = False

    def _freeze(self, **init_args: object) -> None:
        self.init_args = init_args
        self.requires_grad_(False)
        self.eval()

    def score_of_threshold(self, p: float) -> float:
        return logit(p)


class ConfidenceMLP(_HiddenStateScorer):
    """CITER: an MLP over the small model's final hidden state whose sigmoid is the confidence in its token; the
    router defers below tau. Checkpoint keys: `net.{0,2,...}.{weight,bias}` (Linear layers, ReLU between them)."""

    def __init__(self, hidden_size: int, hidden_dims: Sequence[int] = (512, 512), device: torch.device | str = "cpu"):
        super().__init__()
        dims = [int(hidden_size), *(int(d) for d in hidden_dims), 1]
        layers: list[nn.Module] = []
        with torch.device(device):
            for i in range(len(dims) - 1):
                layers.append(nn.Linear(dims[i], dims[i + 1]))
                if i < len(dims) - 2:
                    layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)
        self._freeze(hidden_size=int(hidden_size), hidden_dims=[int(d) for d in hidden_dims])

    def forward(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        return self.net(hidden.float()).squeeze(-1)


class DeferralHead(_HiddenStateScorer):
    """Co-LLM: one extra logit over the small model's final hidden state; sigmoid > eta defers the token. Checkpoint
    keys: `head.weight` [1, hidden], `head.bias` [1]."""

    def __init__(self, hidden_size: int, device: torch.device | str = "cpu"):
        super().__init__()
        with torch.device(device):
            self.head = nn.Linear(int(hidden_size), 1)
        self._freeze(hidden_size=int(hidden_size))

    def forward(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        return self.head(hidden.float()).squeeze(-1)


class NormalizedEntropy(nn.Module):
    """R-Stitch: entropy of the next-token distribution divided by log(vocab), in [0, 1]. No weights."""

    needs_hidden = False
    needs_logits = True

    def __init__(self) -> None:
        super().__init__()
        self.init_args: dict[str, object] = {}

    def forward(self, token_ids: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        x = logits.float()
        p = torch.softmax(x, dim=-1)
        ent = -torch.special.xlogy(p, p).sum(dim=-1)  # xlogy: 0 * log 0 = 0 for masked entries
        return ent / math.log(x.shape[-1])

    def score_of_threshold(self, tau: float) -> float:
        return float(tau)
