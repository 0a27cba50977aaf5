"""KV pages shared between requests and a prefix cache (docs/baselines.md, section 2): a reference-counted pool
whose `grow` asks the cache to evict before it fails, and `PrefixCaching`, which a model server calls around the
core scheduler (`admit` before `add`, `cache` before `complete`, `finish` once the request ended)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tokenrouter.baselines.radix_cache import Node, RadixCache
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request


class RefCountedKVPool(KVPool):
    """Invariant: `refs[p]` is the number of owners of page p (requests listing it, plus the cache); the free list
    holds exactly the pages 1..num_pages-1 with `refs[p] == 0`."""

    __slots__ = ("reclaim", "refs")

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        self.refs = [0] * num_pages
        self.reclaim: Callable[[int], None] | None = None  # evict cached pages: called with how many are missing

    def grow(self, pages: list[int], num_tokens: int) -> bool:
        need = self.extra_pages(pages, num_tokens)
        if need > len(self._free) and self.reclaim is not None:
            self.reclaim(need - len(self._free))
        if need > len(self._free):
            return False
        for _ in range(need):
            p = self._free.popleft()
            self.refs[p] = 1
            pages.append(p)
        return True

    def share(self, pages: list[int]) -> None:
        """One more owner for each of `pages` (each must be held already)."""
        for p in pages:
            if self.refs[p] <= 0:
                raise ValueError(f"page {p} is free: it cannot be shared")
            self.refs[p] += 1

    def release(self, pages: list[int]) -> None:
        """One owner fewer for each of `pages`; those nobody holds any more go back. Empties the list."""
        for p in pages:
            if self.refs[p] <= 0:
                raise ValueError(f"page {p} released more often than held")
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self._free.append(p)
        pages.clear()


@dataclass(slots=True)
class CacheCounters:
    """Cumulative counters of a model server's prefix cache (in its Stats). `host_s`: match + insert + eviction."""

    requests: int = 0
    hits: int = 0  # requests that matched at least one page
    prompt_tokens: int = 0
    matched_tokens: int = 0
    inserted_pages: int = 0
    evicted_pages: int = 0
    host_s: float = 0.0


class PrefixCaching:
    def __init__(self, pool: RefCountedKVPool) -> None:
        self.pool, self.page_size = pool, pool.page_size
        self.tree = RadixCache(pool.page_size)
        self.counters = CacheCounters()
        self._locked: dict[str, Node] = {}  # rid -> the (locked) node its cached path ends at
        self._depth: dict[str, int] = {}  # rid -> that path's length in tokens
        pool.reclaim = self.evict

    def admit(self, req: Request) -> int:
        """Give a new request (no pages yet) the longest cached prefix of its tokens; returns the tokens matched."""
        if req.pages or req.num_computed:
            raise ValueError(f"{req.rid}: admit a request before it holds KV")
        t0 = time.perf_counter()
        ps = self.page_size
        pages, node = self.tree.match(req.token_ids, len(req.token_ids) - 1)
        self.pool.share(pages)
        req.pages = list(pages)
        req.num_computed = len(pages) * ps
        self.tree.lock(node)
        self._locked[req.rid], self._depth[req.rid] = node, req.num_computed
        c = self.counters
        c.requests += 1
        c.hits += bool(pages)
        c.prompt_tokens += len(req.token_ids)
        c.matched_tokens += req.num_computed
        c.host_s += time.perf_counter() - t0
        return req.num_computed

    def cache(self, req: Request, num_tokens: int) -> None:
        """The KV of `req.token_ids[:num_tokens]` is written: cache the whole pages completed since the last call."""
        ps = self.page_size
        full = min(num_tokens // ps, len(req.pages))
        node, depth = self._locked[req.rid], self._depth[req.rid]
        if full * ps <= depth:
            return
        t0 = time.perf_counter()
        new, taken = self.tree.insert(req.token_ids[depth : full * ps], req.pages[depth // ps : full], below=node)
        self.pool.share(taken)
        self.counters.inserted_pages += len(taken)
        self.tree.lock(new)
        self.tree.unlock(node)
        self._locked[req.rid], self._depth[req.rid] = new, full * ps
        self.counters.host_s += time.perf_counter() - t0

    def finish(self, rid: str) -> None:
        node = self._locked.pop(rid, None)
        self._depth.pop(rid, None)
        if node is not None:
            self.tree.unlock(node)

    def evict(self, num_pages: int) -> None:
        t0 = time.perf_counter()
        pages = self.tree.evict(num_pages)
        self.counters.evicted_pages += len(pages)
        self.pool.release(pages)
        self.counters.host_s += time.perf_counter() - t0

    @property
    def cached_pages(self) -> int:
        return self.tree.num_pages
