"""Which requests give their KV pages back when a subserver's pool runs short (without admission only): parked ones
first, then queued ones, youngest first, only those younger than the requester, never RUNNING ones (docs/core.md).
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
