"""Which requests give their KV pages back when a subserver's pool runs short (without admission only).

Parked requests first (their pages are idle), then queued ones, youngest (highest `seq`) first. Only requests
younger than the requester are taken, so work is never thrown away in a loop: the oldest live request can always
take what it needs. RUNNING rows are never victims; a victim recomputes its prefix when it next runs here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from tokenrouter.core.request import ReqStatus, Request


def victims(
    reqs: Iterable[Request], requester: Request, protected: Collection[int], *, any_age: bool = False
) -> Iterator[Request]:
    """Candidates in eviction order. `protected` holds `id()`s of requests in the batch being formed;
    `any_age` also yields older requests (a last resort when the subserver could launch nothing otherwise)."""
    held = [
        r
        for r in reqs
        if r.pages
        and r is not requester
        and id(r) not in protected
        and r.num_inflight == 0
        and r.status in (ReqStatus.PENDING, ReqStatus.WAITING)
        and (any_age or r.seq > requester.seq)
    ]
    held.sort(key=lambda r: (r.status != ReqStatus.PENDING, -r.seq))
    yield from held
