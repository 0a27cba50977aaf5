"""`PrefixCaching` over a `RefCountedKVPool`: random request lifecycles (admit, compute in chunks, cache, finish)
on a small pool, checking after every operation that every page's owners are counted exactly (requests listing it
plus the cache), that free pages are exactly the unowned ones, and that a matched page holds the tokens the new
request expects there (a "KV" written by whoever computed it, recorded independently here)."""

from __future__ import annotations

import random

import pytest

from tokenrouter.baselines.kv import PrefixCaching, RefCountedKVPool
from tokenrouter.core.request import Request


def _check(pool: RefCountedKVPool, cache: PrefixCaching, live: dict[str, Request]) -> None:
    owners = [0] * pool.num_pages
    for r in live.values():
        for p in r.pages:
            owners[p] += 1
    for n in cache.tree._nodes():
        for p in n.pages:
            owners[p] += 1
    assert owners[1:] == pool.refs[1:]
    assert sorted(pool._free) == [p for p in range(1, pool.num_pages) if owners[p] == 0]


def _compute(req: Request, upto: int, content: dict[int, dict[int, int]], ps: int) -> None:
    """The engine's part: write the 'KV' of tokens [num_computed, upto) into the request's pages."""
    for pos in range(req.num_computed, upto):
        content.setdefault(req.pages[pos // ps], {})[pos % ps] = req.token_ids[pos]
    req.num_computed = upto


@pytest.mark.parametrize("ps", [1, 2, 4])
def test_pages_are_shared_counted_and_hold_the_matched_tokens(ps):
    for seed in range(30):
        rng = random.Random(seed * 7 + ps)
        pool = RefCountedKVPool(24, ps)
        cache = PrefixCaching(pool)
        content: dict[int, dict[int, int]] = {}
        live: dict[str, Request] = {}
        prefixes = [[rng.randrange(4) for _ in range(rng.randint(1, 10))] for _ in range(3)]
        k = 0
        for _ in range(150):
            op = rng.random()
            if op < 0.3 and len(live) < 4:
                toks = list(rng.choice(prefixes)) + [rng.randrange(4) for _ in range(rng.randint(1, 6))]
                req = Request(f"r{k}", toks, len(toks))
                k += 1
                matched = cache.admit(req)
                assert matched % ps == 0 and matched < len(toks)
                for j, p in enumerate(req.pages):  # copy-free sharing of the right KV
                    assert content[p] == {i: toks[j * ps + i] for i in range(ps)}, seed
                live[req.rid] = req
            elif op < 0.75 and live:
                req = live[rng.choice(sorted(live))]
                if req.num_computed < len(req.token_ids):
                    upto = min(len(req.token_ids), req.num_computed + rng.randint(1, 5))
                    if pool.grow(req.pages, upto):
                        _compute(req, upto, content, ps)
                        cache.cache(req, upto)
                else:  # "sample" a token: the sequence grows by one
                    req.token_ids.append(rng.randrange(4))
            elif live:
                req = live.pop(rng.choice(sorted(live)))
                pool.release(req.pages)
                cache.finish(req.rid)
            _check(pool, cache, live)
        for req in live.values():
            pool.release(req.pages)
            cache.finish(req.rid)
        live.clear()
        cache.evict(pool.num_pages)
        _check(pool, cache, live)
        assert pool.num_free == pool.num_pages - 1 and cache.cached_pages == 0
        c = cache.counters
        assert c.requests == k and c.evicted_pages == c.inserted_pages


def test_a_full_pool_evicts_unlocked_cache_before_failing():
    pool = RefCountedKVPool(5, 2)  # 4 usable pages
    cache = PrefixCaching(pool)
    a = Request("a", [1, 2, 3, 4, 5], 5)
    cache.admit(a)
    assert pool.grow(a.pages, 5) and len(a.pages) == 3
    cache.cache(a, 5)  # pages of [1,2] and [3,4] cached; the partial one is not
    pool.release(a.pages)
    cache.finish("a")
    assert pool.num_free == 2 and cache.cached_pages == 2
    b = Request("b", [1, 2, 3, 4, 9], 5)
    assert cache.admit(b) == 4 and cache.counters.hits == 1
    c = Request("c", [7, 7, 7, 7, 7, 7, 7], 7)
    cache.admit(c)
    assert not pool.grow(c.pages, 7)  # 4 pages, 2 free, the cached 2 are locked by b: nothing to evict
    assert cache.cached_pages == 2
    pool.release(b.pages)
    cache.finish("b")
    assert pool.grow(c.pages, 7) and cache.cached_pages == 0 and cache.counters.evicted_pages == 2
    with pytest.raises(ValueError):
        pool.release([c.pages[0], c.pages[0]])  # more releases than owners
