"""Admission at the entry: a request goes live only when every model's KV pool has room for it (docs/core.md). Each
live request reserves on every model its length as the entry last saw it plus `growth_tokens`, capped at
`prompt_len + max_tokens`; with none live a request that fits every pool alone always gets in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenrouter.core.request import Request


@dataclass(slots=True)
class PoolSize:
    """What the deployment announces of one model's pool: usable pages (the null page excluded) and page size."""

    pages: int
    page_size: int

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)


@dataclass(slots=True)
class Admission:
    """Reservation ledger kept by the entry. Invariant: `reserved[i]` is the sum of the live requests' reservations on
    model i; admission never takes it past `capacities[i].pages` (growth of what is already live may)."""

    capacities: Sequence[PoolSize]
    growth_tokens: int | None = 256
    reserved: list[int] = field(default_factory=list)
    _held: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)  # length at which a reservation next changes

    def __post_init__(self) -> None:
        if not self.reserved:
            self.reserved = [0] * len(self.capacities)
        if self.growth_tokens is not None and self.growth_tokens < 1:
            raise ValueError(f"growth_tokens must be >= 1 or None, got {self.growth_tokens}")

    def need(self, req: Request) -> tuple[int, ...]:
        """Pages `req` reserves on each model at its current length."""
        tokens = req.prompt_len + req.sampling.max_tokens
        if self.growth_tokens is not None:
            tokens = min(tokens, req.num_tokens + self.growth_tokens)
        return tuple(c.pages_for(tokens) for c in self.capacities)

    def fits_alone(self, req: Request) -> int | None:
        """None if `req` fits every pool when alone, else the index of the first model it cannot fit."""
        tokens = req.prompt_len + req.sampling.max_tokens
        for i, c in enumerate(self.capacities):
            if c.pages_for(tokens) > c.pages:
                return i
        return None

    def try_reserve(self, req: Request) -> bool:
        need = self.need(req)
        if any(r + n > c.pages for r, n, c in zip(self.reserved, need, self.capacities, strict=True)):
            return False
        self.reserved = [r + n for r, n in zip(self.reserved, need, strict=True)]
        self._held[req.rid] = need
        self._next[req.rid] = req.num_tokens + self._step
        return True

    @property
    def _step(self) -> int:
        return min(c.page_size for c in self.capacities)

    def observe(self, req: Request) -> None:
        """The entry saw `req` at its current length: move its reservation along (pages change at most once
        per smallest page of growth, so most calls return at once)."""
        if self.growth_tokens is None or req.num_tokens < self._next.get(req.rid, 1 << 62):
            return
        old = self._held[req.rid]
        need = self.need(req)
        self._next[req.rid] = req.num_tokens + self._step
        if need != old:
            self.reserved = [r - o + n for r, o, n in zip(self.reserved, old, need, strict=True)]
            self._held[req.rid] = need

    def release(self, rid: str) -> None:
        need = self._held.pop(rid, None)
        self._next.pop(rid, None)
        if need is not None:
            self.reserved = [r - n for r, n in zip(self.reserved, need, strict=True)]

    @property
    def num_held(self) -> int:
        return len(self._held)
