"""The live request count N that delayed batching keys its thresholds B(N) on, as each subserver knows it: the
entry owns N and announces each change with a strictly increasing epoch; a peer keeps the highest epoch, so its view
lags but never moves backwards (why no lag can deadlock: docs/core.md, "Why a lagging N cannot deadlock").
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.core.messages import LiveCount


@dataclass(slots=True)
class LiveView:
    """One subserver's view of N. `owner` (the entry) changes it; peers only `observe`."""

    model: int
    num_models: int
    owner: bool
    active: int = 0
    epoch: int = 0

    def change(self, delta: int) -> None:
        """Admission (+1) or finish (-1) at the owner."""
        if not self.owner:
            raise ValueError(f"model {self.model} does not own the live count")
        self.active += delta
        self.epoch += 1
        if self.active < 0:
            raise ValueError("live count went negative (a finish was counted twice)")

    def observe(self, active: int, epoch: int) -> bool:
        """Adopt a peer's announcement if it is newer than what this view holds; True if it changed."""
        if self.owner or epoch <= self.epoch:
            return False
        self.active, self.epoch = active, epoch
        return True

    def announce(self) -> list[LiveCount]:
        """The current value for every peer (the owner calls this after each change)."""
        return [LiveCount(self.model, p, self.active, self.epoch) for p in range(self.num_models) if p != self.model]
