"""The live request count N that delayed batching keys its thresholds B(N) on, as each subserver knows it.

The entry subserver owns N (it admits every request and learns every finish); it announces each change to
all peers as a `LiveCount` with a strictly increasing epoch, and piggybacks the same pair on the requests
it hands off. A peer keeps the pair with the highest epoch it has received, so late or reordered messages
never move its view backwards. Between an admission or finish and the announcement's arrival, a peer's N
lags; the deadlock guard must hold for any N it may still believe.

Why no lag can deadlock a delayed deployment (`policy.clamp_thresholds` gives every subserver the
thresholds B(N) clamped so that sum_i (B_i - 1) < N for the N it believes):

Drivers ask `schedule()` again after every delivered message and every completed step, so the deployment
can only stop in a state where nothing runs and no message is in flight. In such a state:
1. every announcement the entry sent has arrived; the entry's epochs increase strictly and peers keep the
   highest, so every peer believes exactly the entry's current N;
2. every finish has reached the entry, so the entry's N is the number L of live requests;
3. a live request is WAITING on exactly one subserver (its owner; PENDING elsewhere, since nothing runs and
   nothing is in flight), so sum_i k_i = L for the ready counts k_i;
4. all subservers derive B from the same N = L with the same deterministic clamp, so they use one vector B
   with sum_i (B_i - 1) < L. If every k_i <= B_i - 1, then L = sum_i k_i <= sum_i (B_i - 1) < L, which is
   false; so some subserver has k_i >= B_i and launches.
So a stop with a live request is impossible, whatever N each peer believed while messages were in flight:
stale views only delay launches until the next announcement lands. (Admission waits are separate: a request
queued at admission is not live, and the last finish frees every reservation, so the queue's head always
gets in; see `tokenrouter.core.admission`.)
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
