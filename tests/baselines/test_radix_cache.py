"""`RadixCache` against a brute-force reference: a dict from every cached page-aligned prefix to the page holding its
last page of tokens, with per-prefix recency stamps and lock counts kept the way the cache documents them.

Seeded random operations over a small alphabet (so sequences share prefixes and nodes split often): inserts,
matches with and without a limit, locks, unlocks and evictions, each checked against the reference."""

from __future__ import annotations

import random

import pytest

from tokenrouter.baselines.radix_cache import RadixCache


class Reference:
    def __init__(self, ps: int) -> None:
        self.ps = ps
        self.page: dict[tuple[int, ...], int] = {}  # cached prefix -> page of its last ps tokens
        self.stamp: dict[tuple[int, ...], int] = {}
        self.locks: list[tuple[int, ...]] = []  # each lock: the prefix it ends at (covers all shorter ones)
        self.clock = 0

    def prefixes(self, tokens, limit):
        ps = self.ps
        return [tuple(tokens[: j * ps]) for j in range(1, limit // ps + 1)]

    def match(self, tokens, limit):
        self.clock += 1
        out = []
        for p in self.prefixes(tokens, limit - limit % self.ps):
            if p not in self.page:
                break
            out.append(self.page[p])
            self.stamp[p] = self.clock
        return out

    def insert(self, tokens, pages):
        self.clock += 1
        taken = []
        for j, p in enumerate(self.prefixes(tokens, len(tokens))):
            if p not in self.page:
                self.page[p] = pages[j]
                taken.append(pages[j])
            self.stamp[p] = self.clock
        return taken

    def locked(self, p) -> bool:
        return any(lk[: len(p)] == p for lk in self.locks)

    def leaf(self, p) -> bool:
        return not any(len(q) > len(p) and q[: len(p)] == p for q in self.page)


def _seq(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3) for _ in range(n)]


@pytest.mark.parametrize("ps", [1, 2, 4])
def test_radix_cache_matches_the_reference(ps):
    for seed in range(150):
        rng = random.Random(seed * 10 + ps)
        tree, ref = RadixCache(ps), Reference(ps)
        next_page = 1
        held: list[tuple[object, tuple[int, ...]]] = []  # (node, prefix) of each lock taken
        for _ in range(120):
            op = rng.random()
            if op < 0.35:  # insert a sequence of whole pages
                toks = _seq(rng, ps * rng.randint(1, 6))
                pages = list(range(next_page, next_page + len(toks) // ps))
                next_page += len(pages)
                node, taken = tree.insert(toks, pages)
                assert taken == ref.insert(toks, pages), seed
                if rng.random() < 0.3:
                    tree.lock(node)
                    held.append((node, tuple(toks)))
                    ref.locks.append(tuple(toks))
            elif op < 0.7:  # match, sometimes with a limit (as a server does: leave one token to compute)
                toks = _seq(rng, rng.randint(0, 7 * ps))
                limit = len(toks) if rng.random() < 0.5 else max(0, len(toks) - 1)
                pages, node = tree.match(toks, limit)
                assert pages == ref.match(toks, limit), seed
                if pages and rng.random() < 0.3:
                    tree.lock(node)
                    held.append((node, tuple(toks[: len(pages) * ps])))
                    ref.locks.append(tuple(toks[: len(pages) * ps]))
            elif op < 0.75 and held:
                node, key = held.pop(rng.randrange(len(held)))
                tree.unlock(node)
                ref.locks.remove(key)
            elif op < 0.8 and held:  # a request extends the path it holds: insert below its node
                k = rng.randrange(len(held))
                node, key = held[k]
                ext = _seq(rng, ps * rng.randint(1, 3))
                pages = list(range(next_page, next_page + len(ext) // ps))
                next_page += len(pages)
                new, taken = tree.insert(ext, pages, below=node)
                full = list(key) + ext
                assert taken == ref.insert(full, [ref.page[p] for p in ref.prefixes(key, len(key))] + pages), seed
                tree.lock(new)
                tree.unlock(node)
                held[k] = (new, tuple(full))
                ref.locks[ref.locks.index(key)] = tuple(full)
            else:
                n = rng.randint(1, 5)
                evictable = [p for p in ref.page if not ref.locked(p)]
                assert tree.evictable_pages() == len(evictable)
                out = tree.evict(n)
                gone = [p for p in ref.page if ref.page[p] in set(out)]
                assert sorted(out) == sorted(ref.page[p] for p in gone)
                assert len(out) >= min(n, len(evictable)), seed
                assert all(not ref.locked(p) for p in gone), "a locked prefix was evicted"
                for p in gone:
                    del ref.page[p]
                # Only whole subtrees go: nothing left extends an evicted prefix.
                assert not any(q[: len(p)] == p for p in gone for q in ref.page)
                # Least recently used first: every evicted prefix is at most as recent as every unlocked leaf left.
                left = [ref.stamp[p] for p in ref.page if ref.leaf(p) and not ref.locked(p)]
                if gone and left:
                    assert max(ref.stamp[p] for p in gone) <= min(left), seed
            assert tree.num_pages == len(ref.page)


def test_a_match_splits_nodes_so_a_lock_covers_exactly_the_match():
    tree = RadixCache(2)
    _, taken = tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    assert taken == [10, 11, 12]
    pages, node = tree.match([1, 2, 3, 4, 9, 9])
    assert pages == [10, 11] and node.key == (1, 2, 3, 4)
    tree.lock(node)
    assert tree.evict(10) == [12]  # the unlocked tail goes; the matched part is kept
    assert tree.match([1, 2, 3, 4, 5, 6])[0] == [10, 11]
    tree.unlock(node)
    assert sorted(tree.evict(10)) == [10, 11] and tree.num_pages == 0
    with pytest.raises(RuntimeError):
        tree.unlock(node)


def test_insert_keeps_cached_pages_and_takes_only_the_new_tail():
    tree = RadixCache(2)
    tree.insert([1, 2, 3, 4], [10, 11])
    _, taken = tree.insert([1, 2, 3, 4, 5, 6], [20, 21, 22])  # a request that computed its own copy
    assert taken == [22] and tree.match([1, 2, 3, 4, 5, 6, 7])[0] == [10, 11, 22]
    with pytest.raises(ValueError):
        tree.insert([1, 2, 3], [10, 11])
