"""Device page tables with persistent row slots, changed incrementally (docs/engine.md, Host planning). Invariants:
slot 0 is the null slot (all zeros). `written[s]` leading entries of slot s are on the device and equal
`owner[s].pages[:written[s]]` unless the pool took pages back, which a row starting at 0, the O(1) first/last page
probe or `page_owner` detects. A page held by two live requests (unless `shared_pages`), page 0 or an id outside
the cache is a BatchError; `plan` validates before `commit` changes any state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenrouter.core.request import Request
from tokenrouter.engine.errors import BatchError


@dataclass(slots=True)
class TablePlan:
    """What one step does to the table: a slot per row and the (flat index, page) writes."""

    slots: list[int]  # per planned row
    upd_idx: list[int] = field(default_factory=list)  # flat index slot * width + column
    upd_val: list[int] = field(default_factory=list)
    # state changes applied by `commit` (only after the whole batch validated)
    new_owner: dict[int, Request] = field(default_factory=dict)  # slot -> request (new or rewritten slots)
    written: dict[int, int] = field(default_factory=dict)  # slot -> pages written after this step
    claims: dict[int, tuple[int, int]] = field(default_factory=dict)  # page -> (slot, column)
    evict: list[int] = field(default_factory=list)
    taken: int = 0  # slots taken from the end of the free list


class PageTable:
    def __init__(self, num_slots: int, width: int, num_pages: int, device: torch.device, *,
                 shared_pages: bool = False) -> None:  # fmt: skip
        if num_slots < 2:
            raise ValueError("a page table needs at least 2 slots (slot 0 is the null slot)")
        self.num_slots, self.width, self.num_pages = num_slots, width, num_pages
        self.shared_pages = shared_pages
        self.table = torch.zeros(num_slots, width, dtype=torch.int32, device=device)
        self.owner: list[Request | None] = [None] * num_slots
        self.written = [0] * num_slots
        self.first = [0] * num_slots  # first written page (the O(1) probe)
        self.last = [0] * num_slots  # last written page
        self.stamp = [0] * num_slots  # commit count when the slot last ran (recency for eviction)
        self.page_owner = [-1] * num_pages  # slot holding the page, -1 none
        self.page_col = [0] * num_pages
        self._free = list(range(num_slots - 1, 0, -1))
        # id(request) -> slot, read-only outside this class (the decode fast path reads it; `slot_of` checks the owner)
        self.slot_index: dict[int, int] = {}
        self._commits = 0

    @property
    def nbytes(self) -> int:
        return self.table.numel() * 4

    def slot_of(self, req: Request) -> int | None:
        s = self.slot_index.get(id(req))
        return s if s is not None and self.owner[s] is req else None

    # ---- planning (no state change) -------------------------------------------------------------------
    def plan(self, reqs: list[Request], starts: list[int], n_pages: list[int], name: Callable[[int], str]) -> TablePlan:
        """Slots and page writes for rows (one request each) needing `n_pages[i]` pages; BatchError names the row."""
        slots: list[int] = []
        plan = TablePlan(slots)
        slot_of, owner, written, first, last = self.slot_index, self.owner, self.written, self.first, self.last
        width = self.width
        victims = None
        for i, req in enumerate(reqs):
            need, start, pages = n_pages[i], starts[i], req.pages
            s = slot_of.get(id(req))
            if s is not None and owner[s] is req:
                done = written[s]
                # Fast path: the slot holds every page the row needs and the probes agree.
                if done >= need and start and need and len(pages) >= done and pages[0] == first[s] \
                        and pages[done - 1] == last[s]:  # fmt: skip
                    slots.append(s)
                    continue
                if done and (start == 0 or len(pages) < done or pages[0] != first[s] or pages[done - 1] != last[s]):
                    done = 0  # the pool took pages back (preemption) or the row restarts: rewrite the slot
                if done == 0:
                    plan.new_owner[s] = req
            else:
                done = 0
                if plan.taken < len(self._free):
                    s = self._free[-1 - plan.taken]
                    plan.taken += 1
                else:
                    if victims is None:
                        victims = self._victims(reqs)
                    s = next(victims, None)
                    if s is None:
                        raise BatchError(f"{name(i)}: no free page-table slot ({self.num_slots - 1} in use)",
                                         (req.rid,))  # fmt: skip
                    plan.evict.append(s)
                plan.new_owner[s] = req
            if need > width:
                raise BatchError(f"{name(i)}: needs {need} pages, more than the page-table width {width}",
                                 (req.rid,))  # fmt: skip
            if need > done:
                self.plan_pages(plan, i, s, req, pages, done, need, reqs, name)
            if need > 0:
                plan.written[s] = max(need, done)
            slots.append(s)
        return plan

    def _victims(self, reqs: list[Request]):
        """Used slots of requests outside the batch, least recently run first."""
        in_batch = {id(r) for r in reqs}
        owner = self.owner
        used = [s for s in range(1, self.num_slots) if owner[s] is not None and id(owner[s]) not in in_batch]
        return iter(sorted(used, key=self.stamp.__getitem__))

    def plan_pages(self, plan: TablePlan, i: int, s: int, req: Request, pages: list[int], done: int, need: int,
                   reqs: list[Request], name: Callable[[int], str]) -> None:  # fmt: skip
        """Plan writing columns done..need-1 of slot s for row i (validated; no state change)."""
        claims, width, num_pages = plan.claims, self.width, self.num_pages
        for col in range(done, need):
            p = pages[col]
            if not 0 < p < num_pages:
                raise BatchError(f"{name(i)}: page id {p} at column {col} is outside 1..{num_pages - 1}",
                                 (req.rid,))  # fmt: skip
            c = claims.get(p)
            if c is not None and c[0] != s and not self.shared_pages:
                j = plan.slots.index(c[0]) if c[0] in plan.slots else i
                raise BatchError(f"{name(i)} and {name(j)}: both hold KV page {p}", (req.rid, reqs[j].rid))
            o = self.page_owner[p]
            if o > 0 and o != s and o not in plan.evict and not self.shared_pages:
                other = self.owner[o]
                c2 = self.page_col[p]
                if other is not None and other is not req and len(other.pages) > c2 and other.pages[c2] == p:
                    k = next((k for k, r in enumerate(reqs) if r is other), None)
                    who = name(k) if k is not None else f"request {other.rid} (not in this batch)"
                    # Only this row fails: the other request is not in the batch.
                    raise BatchError(f"{name(i)} and {who}: both hold KV page {p}", (req.rid,))
            plan.upd_idx.append(s * width + col)
            plan.upd_val.append(p)
            claims[p] = (s, col)

    # ---- commit ---------------------------------------------------------------------------------------
    def commit(self, plan: TablePlan) -> None:
        """Apply a validated plan's bookkeeping (the device writes travel with the step's inputs)."""
        if plan.taken:
            del self._free[-plan.taken :]
        for s in plan.evict:
            self._drop(s)
            self._free.remove(s)  # re-taken at once by the plan
        for s, req in plan.new_owner.items():
            old = self.owner[s]
            if old is not None and old is not req:
                self.slot_index.pop(id(old), None)
            self.owner[s] = req
            self.slot_index[id(req)] = s
            self.written[s] = 0
        for p, (s, col) in plan.claims.items():
            o = self.page_owner[p]
            if o > 0 and o != s and not (self.shared_pages and self._holds(o, p, col)):
                self.written[o] = 0  # the page moved: the old slot's table is stale
            self.page_owner[p] = s
            self.page_col[p] = col
        for s, n in plan.written.items():
            req = self.owner[s]
            assert req is not None
            self.written[s] = n
            self.first[s] = req.pages[0]
            self.last[s] = req.pages[n - 1]
        self._commits += 1
        stamp, now = self.stamp, self._commits
        for s in plan.slots:
            stamp[s] = now

    def _holds(self, s: int, p: int, col: int) -> bool:
        """Slot s's request still lists page p at column `col` (a shared prefix page, not a page that moved)."""
        req = self.owner[s]
        return req is not None and self.written[s] > col and len(req.pages) > col and req.pages[col] == p

    def forget(self, reqs: list[Request]) -> None:
        """After a failed step: the slots of these requests may be half-written; make them rewrite."""
        for req in reqs:
            s = self.slot_of(req)
            if s is not None:
                self.written[s] = 0

    def _drop(self, s: int) -> None:
        old = self.owner[s]
        if old is not None:
            self.slot_index.pop(id(old), None)
        self.owner[s] = None
        self.written[s] = 0
        self._free.append(s)
