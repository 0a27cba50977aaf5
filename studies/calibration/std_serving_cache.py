"""Standard serving's prefix-cache bookkeeping per hop, measured on this host (a study: what part of the profile's
fitted per-hop cost the radix cache explains).

    python studies/calibration/std_serving_cache.py [--visits 200]

Under std-serving every hop returns to a model server as a new request carrying the whole sequence. The server's
prefix cache (`baselines.kv.PrefixCaching`) then re-matches the longest cached prefix in its radix tree, shares
and locks the matched pages, inserts the pages the request writes, and unlocks them when it leaves. The profile's
`std_serving` prices all host work of a hop per re-matched row (`hop_overhead_ms + hop_overhead_ms_per_ktok *
prefix_tokens / 1000`, today fitted to two live cells): this cache work, and the dispatcher's round trip and the
server's admission of a new request besides. The GPU work of the re-match (extending the tokens the peer wrote)
is a prefill row the pass model already prices.

The benchmark replays that cycle on the real cache: sequences that grow by a peer's run of tokens between visits,
each visit timed from `admit` to `finish` (match, share, lock, insert, unlock) at several prefix lengths, beside
other sequences in the tree (a server holds many), and fits the line by least squares. Pure Python, so it needs
no GPU; the host it runs on is the one that serves.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import numpy as np

PREFIX_TOKENS = (256, 1024, 4096)  # a hop's sequence length when it returns
PEER_RUN = 10  # tokens the peer wrote since this model's last visit (R2R at hop 0.1: about 10)
BACKGROUND = 64  # other sequences cached in the tree meanwhile
PAGE_SIZE = 16


def _visit_ms(cache: Any, pool: Any, token_ids: list[int], rid: str) -> tuple[float, int]:
    """One re-match of `token_ids`: ms for admit (match + share + lock), caching the pages it completes, and finish;
    and the tokens it matched."""
    from tokenrouter.core.request import Request

    req = Request(rid, list(token_ids), len(token_ids))
    t0 = time.perf_counter()
    matched = cache.admit(req)
    if not pool.grow(req.pages, len(token_ids)):  # the pages its extend writes, as the server's pool grows them
        raise RuntimeError("std-serving benchmark: the pool is too small")
    cache.cache(req, len(token_ids))
    cache.finish(rid)
    pool.release(req.pages)
    return (time.perf_counter() - t0) * 1e3, matched


def visit_times(prefix_tokens: int, visits: int = 200, seed: int = 0) -> tuple[list[float], list[int]]:
    """ms per re-matched visit of a sequence `prefix_tokens` long when it first returns (each visit adds `PEER_RUN`
    tokens and returns again), with `BACKGROUND` other sequences in the same tree; and the tokens each matched."""
    from tokenrouter.baselines.kv import PrefixCaching, RefCountedKVPool

    rng = random.Random(seed)
    longest = prefix_tokens + PEER_RUN * (visits + 1)
    pool = RefCountedKVPool((BACKGROUND + 2) * (longest // PAGE_SIZE + 2), PAGE_SIZE)
    cache = PrefixCaching(pool)
    for k in range(BACKGROUND):  # other requests' paths: the tree a busy server walks
        _visit_ms(cache, pool, [rng.randrange(1, 150_000) for _ in range(prefix_tokens)], f"bg{k}")
    seq = [rng.randrange(1, 150_000) for _ in range(prefix_tokens)]
    _visit_ms(cache, pool, seq, "warm")  # its first visit: nothing to match yet
    times, matched = [], []
    for v in range(visits):
        seq += [rng.randrange(1, 150_000) for _ in range(PEER_RUN)]
        ms, m = _visit_ms(cache, pool, seq, f"v{v}")
        times.append(ms)
        matched.append(m)
    return times, matched


def measure(prefix_tokens: tuple[int, ...] = PREFIX_TOKENS, visits: int = 200) -> dict[str, Any]:
    """{"hop_overhead_ms", "hop_overhead_ms_per_ktok", "points"}: the line through the median visit time at each
    prefix length (least squares; intercept and slope clipped at 0, as the profile requires)."""
    medians = {n: statistics.median(visit_times(n, visits)[0]) for n in prefix_tokens}
    x = np.array([n / 1000 for n in medians])
    y = np.array(list(medians.values()))
    slope, intercept = np.polyfit(x, y, 1) if len(x) > 1 else (0.0, float(y[0]))
    return {"hop_overhead_ms": max(0.0, float(intercept)), "hop_overhead_ms_per_ktok": max(0.0, float(slope)),
            "points": {str(n): round(ms, 6) for n, ms in medians.items()}}  # fmt: skip


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--visits", type=int, default=200)
    print(json.dumps(measure(visits=ap.parse_args().visits), indent=1))
