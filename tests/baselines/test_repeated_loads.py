"""Three loads in a row on one std-serving model server's prefix cache (issue 30: the baseline's second and third
loads ran at 57-70% of the first while its cache filled the pool).

A load is what `tr bench` sends a model server in std-serving: N concurrent client requests, each a prompt and an
output written in visits (each visit a new request carrying the whole sequence so far, re-matched in the cache,
extended by one token a step, cached page by page, finished; a hop puts one token of the other model between
visits). Loads use different prompts and outputs, so the first fills the cache and later ones must evict.

What must hold on every load, full pool or not: the tree keeps a node per cached sequence (not one per page), and
eviction examines a bounded number of tree nodes per page it frees (a serving loop asks for a page or two per step
once the pool is full; walking the whole tree each time was the slowdown). Checked by counting the nodes the
cache's own tree walk (`RadixCache._nodes`) yields, so the bound holds for any eviction strategy. Page ownership
is checked exactly after every load."""

from __future__ import annotations

import random

from test_prefix_kv import _check

from tokenrouter.baselines.kv import PrefixCaching, RefCountedKVPool
from tokenrouter.baselines.radix_cache import RadixCache
from tokenrouter.core.request import Request

PAGE = 4


def _visit(cache: PrefixCaching, pool: RefCountedKVPool, rid: str, seq: list[int]) -> Request:
    req = Request(rid, list(seq), len(seq))
    cache.admit(req)
    assert pool.grow(req.pages, len(seq))
    req.num_computed = len(seq)  # the prefill of the unmatched tail
    cache.cache(req, req.num_computed)
    return req


def _load(cache: PrefixCaching, pool: RefCountedKVPool, seed: int, *, concurrent: int = 16, requests: int = 48,
          prompt: int = 20, output: int = 48, hop: float = 0.15) -> int:  # fmt: skip
    """One load; returns the number of visits (requests the server saw)."""
    rng = random.Random(seed)
    todo = [([rng.randrange(1000) for _ in range(prompt)], output) for _ in range(requests)]
    active: list[list] = []
    visits = 0
    while todo or active:
        while len(active) < concurrent and todo:
            seq, left = todo.pop()
            visits += 1
            active.append([_visit(cache, pool, f"s{seed}v{visits}", seq), left])
        nxt = []
        for flow in active:
            req, left = flow
            assert pool.grow(req.pages, req.num_tokens + 1)
            req.token_ids.append(rng.randrange(1000))
            req.num_computed += 1
            cache.cache(req, req.num_computed)
            left -= 1
            if left and rng.random() > hop:
                flow[1] = left
                nxt.append(flow)
                continue
            seq = list(req.token_ids)
            pool.release(req.pages)
            cache.finish(req.rid)
            if left > 1:  # a hop: the other model writes a token, then the next visit comes back here
                seq.append(rng.randrange(1000))
                visits += 1
                nxt.append([_visit(cache, pool, f"s{seed}v{visits}", seq), left - 1])
        active = nxt
    return visits


def test_three_loads_in_a_row_evict_without_walking_the_tree(monkeypatch):
    walked = [0]
    real = RadixCache._nodes

    def counting(self):
        for n in real(self):
            walked[0] += 1
            yield n

    monkeypatch.setattr(RadixCache, "_nodes", counting)
    # Room for about one and a half loads of cache: the second load fills the pool, the third evicts throughout.
    pool = RefCountedKVPool(1 + 3 * 48 * (20 + 48) // PAGE // 2, PAGE)
    cache = PrefixCaching(pool)
    per_load = []
    for seed in range(3):
        w0, e0 = walked[0], cache.counters.evicted_pages
        visits = _load(cache, pool, seed)
        evicted = cache.counters.evicted_pages - e0
        nodes = sum(1 for _ in real(cache.tree))
        per_load.append((walked[0] - w0, evicted, nodes, visits))
        _check(pool, cache, {})
        assert pool.num_free + cache.cached_pages == pool.num_pages - 1
    assert per_load[0][1] == 0 and per_load[2][1] > 0, per_load  # the third load runs on a full pool
    for walk, evicted, nodes, visits in per_load:
        # a node per cached sequence: at most one per visit (each ends a sequence) plus the splits of matches
        assert nodes <= 2 * visits, per_load
        # eviction that examines a few nodes per page it frees, not the whole tree each time
        assert walk <= 4 * evicted + 2 * nodes, per_load
