"""A radix tree over token ids whose edges are whole KV pages: the prefix cache of a standard-serving model server
(docs/baselines.md, section 2). A partial page is never shared (the next token's KV would be written into it);
`evict` takes unlocked leaves, least recently used first, from a heap checked lazily (no tree walk)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Node:
    key: tuple[int, ...]
    pages: list[int]
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)  # keyed by the child's first page of tokens
    lock: int = 0  # requests whose locked path passes through this node
    last_use: int = 0


class RadixCache:
    """Invariants: every non-root key is `len(pages) * page_size` tokens; siblings differ in their first page; a
    node's lock count is at least the sum of its children's (a lock covers the path to the root)."""

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.root = Node((), [], None, lock=1)  # never evicted
        self.num_pages = 0
        self.num_nodes = 0  # without the root
        self._clock = 0
        self._heap: list[tuple[int, int, Node]] = []  # eviction candidates: (stamp when pushed, push order, node)
        self._pushes = 0

    def match(self, tokens: Sequence[int], max_tokens: int | None = None) -> tuple[list[int], Node]:
        """Pages of the longest cached prefix (whole pages, at most `max_tokens` tokens), and the node where it ends
        (split there, so locking it locks exactly the match)."""
        limit = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
        pages, node, _ = self._walk(tokens, limit - limit % self.page_size)
        return pages, node

    def insert(self, tokens: Sequence[int], pages: Sequence[int], below: Node | None = None) -> tuple[Node, list[int]]:
        """Cache `tokens` (whole pages) in `pages`: (the node where they end, the pages the tree took). `below`: they
        continue the caller's locked path to this node, so the walk starts there (a leaf only it holds grows)."""
        ps = self.page_size
        if len(tokens) != len(pages) * ps:
            raise ValueError(f"{len(tokens)} tokens do not fill {len(pages)} pages of {ps}")
        _, node, done = self._walk(tokens, len(tokens), below or self.root)
        if done == len(tokens):
            return node, []
        taken = list(pages[done // ps :])
        self.num_pages += len(taken)
        if node is below and node is not self.root and not node.children and node.lock == 1:
            node.key += tuple(tokens[done:])
            node.pages.extend(taken)
            node.last_use = self._clock
            self._push(node)
            return node, taken
        leaf = Node(tuple(tokens[done:]), taken, node, last_use=self._clock)
        node.children[leaf.key[:ps]] = leaf
        self.num_nodes += 1
        self._push(leaf)
        return leaf, taken

    def _walk(self, tokens: Sequence[int], limit: int, start: Node | None = None) -> tuple[list[int], Node, int]:
        """Follow `tokens[:limit]` down from `start`: (pages, last node, tokens matched), splitting where the match
        ends; stamps the path from the root (a node is never older than its descendants)."""
        ps = self.page_size
        self._clock += 1
        node, i, pages = start or self.root, 0, []
        up: Node | None = node
        while up is not None:
            up.last_use = self._clock
            up = up.parent
        while i < limit:
            child = node.children.get(tuple(tokens[i : i + ps]))
            if child is None:
                break
            k = 1  # the first page matched: it is the child's key in the parent
            while k < len(child.pages) and i + (k + 1) * ps <= limit and \
                    tuple(tokens[i + k * ps : i + (k + 1) * ps]) == child.key[k * ps : (k + 1) * ps]:  # fmt: skip
                k += 1
            if k < len(child.pages):
                child = self._split(child, k)
            child.last_use = self._clock
            pages.extend(child.pages)
            i += len(child.key)
            node = child
        return pages, node, i

    def _split(self, node: Node, k: int) -> Node:
        """Cut `node` after its first k pages; returns the new upper part (which inherits lock and recency)."""
        ps, parent = self.page_size, node.parent
        assert parent is not None and 0 < k < len(node.pages)
        upper = Node(node.key[: k * ps], node.pages[:k], parent, lock=node.lock, last_use=node.last_use)
        parent.children[upper.key[:ps]] = upper
        node.key, node.pages, node.parent = node.key[k * ps :], node.pages[k:], upper
        upper.children[node.key[:ps]] = node
        self.num_nodes += 1
        return upper

    def lock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None:
            n.lock += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None:
            if n.lock <= 0:
                raise RuntimeError("unlock of a path that is not locked")
            n.lock -= 1
            if n.lock == 0 and not n.children:
                self._push(n)
            n = n.parent

    def evict(self, num_pages: int) -> list[int]:
        """Drop least recently used unlocked leaves (whole nodes) until `num_pages` pages are out; the dropped pages."""
        out: list[int] = []
        if num_pages <= 0:
            return out
        heap = self._heap
        while heap and len(out) < num_pages:
            stamp, _, n = heapq.heappop(heap)
            if not self._free_leaf(n):
                continue  # evicted already, locked, or a parent again: a later event pushes it anew
            if stamp != n.last_use:
                self._push(n)  # used since it was pushed: back in at its stamp
                continue
            parent = n.parent
            assert parent is not None
            del parent.children[n.key[: self.page_size]]
            n.parent = None  # marks it gone for the entries still in the heap
            out.extend(n.pages)
            self.num_pages -= len(n.pages)
            self.num_nodes -= 1
            if parent is not self.root and not parent.children and parent.lock == 0:
                self._push(parent)
        if len(heap) > 4 * self.num_nodes + 64:  # stale entries pile up: rebuild from the free leaves
            self._heap = []
            for n in self._nodes():
                if n.lock == 0 and not n.children:
                    self._push(n)
        return out

    def _push(self, node: Node) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (node.last_use, self._pushes, node))

    def _free_leaf(self, n: Node) -> bool:
        """`n` is in the tree, unlocked and childless (an eviction candidate)."""
        p = n.parent
        return p is not None and n.lock == 0 and not n.children and p.children.get(n.key[: self.page_size]) is n

    def evictable_pages(self) -> int:
        """Pages no request holds a lock on (all of them can be evicted, leaves first)."""
        return sum(len(n.pages) for n in self._nodes() if n.lock == 0)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())
