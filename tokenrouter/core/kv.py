"""KV page accounting: the one book of which pages a request owns (the scheduler allocates, the engine reads
`Request.pages` as the page table). Page 0 is the null page that padded CUDA-graph rows write into, never handed out.
"""

from __future__ import annotations

from collections import deque


class KVPool:
    """Fixed-size pool of KV pages of `page_size` tokens each. Invariant: every page id in 1..num_pages-1 is free
    or in exactly one request's page list."""

    __slots__ = ("_free", "num_pages", "page_size")

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"a KV pool needs at least 2 pages (one is the reserved null page), got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(1, num_pages))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request could hold if it had the whole pool."""
        return (self.num_pages - 1) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def extra_pages(self, pages: list[int], num_tokens: int) -> int:
        """Pages to add so that `pages` covers `num_tokens` tokens."""
        return max(0, self.pages_for(num_tokens) - len(pages))

    def grow(self, pages: list[int], num_tokens: int) -> bool:
        """Extend `pages` in place to cover `num_tokens`; all-or-nothing, False when the pool is short."""
        need = -(-num_tokens // self.page_size) - len(pages)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        pages.extend(self._free.popleft() for _ in range(need))
        return True

    def release(self, pages: list[int]) -> None:
        """Return every page of `pages` to the pool and empty the list."""
        self._free.extend(pages)
        pages.clear()
