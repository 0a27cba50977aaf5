"""Standard serving's host cost per returning hop, measured (profile field `std_serving`).

A hop that returns to a standard-serving model server is a new request: the server re-matches its sequence against
its prefix cache (match + lock), caches the pages the visit completes, and unlocks them at the visit's end. This
times those calls of the baseline's own `PrefixCaching` for sequences of several lengths and fits
`hop_overhead_ms + hop_overhead_ms_per_ktok * prefix / 1000` by least squares. The re-prefill itself (the part of
the last page that does not match, plus the peer's tokens) is not in it: the simulator prices that as the extend
rows it is (`sim.loop`, whole-page re-match).
"""

from __future__ import annotations

import random
import time

from scipy.stats import linregress

from tokenrouter.baselines.kv import PrefixCaching, RefCountedKVPool
from tokenrouter.calibration.profile import StdServingInfo
from tokenrouter.core.request import Request

PREFIX_LENS = (128, 512, 2048, 8192)
VISIT_TOKENS = 10  # the tokens a visit adds before it hops again (R2R at hop 0.1)


def visit_ms(prefix_len: int, visits: int, page_size: int = 16, seed: int = 0) -> float:
    """Mean host ms of one returning visit (admit, cache the visit's pages, finish) to a sequence of
    `prefix_len` tokens whose whole pages are cached, each visit adding `VISIT_TOKENS` fresh tokens."""
    rng = random.Random(seed)
    pages_per_seq = -(-(prefix_len + VISIT_TOKENS) // page_size) + 1
    pool = RefCountedKVPool((visits + 2) * pages_per_seq + 1, page_size)
    cache = PrefixCaching(pool)
    seq = [rng.randrange(1 << 16) for _ in range(prefix_len)]
    first = Request("warm", list(seq), prefix_len)
    cache.admit(first)
    assert pool.grow(first.pages, prefix_len)
    cache.cache(first, prefix_len)
    total = 0.0
    for v in range(visits):
        ids = seq + [rng.randrange(1 << 16) for _ in range(VISIT_TOKENS)]
        req = Request(f"v{v}", ids, len(ids))
        t0 = time.perf_counter()
        cache.admit(req)
        pool.grow(req.pages, len(ids))
        cache.cache(req, len(ids))
        cache.finish(req.rid)
        total += time.perf_counter() - t0
        pool.release(req.pages)
    cache.finish(first.rid)
    pool.release(first.pages)
    return total / visits * 1000.0


def measure_std_serving(visits: int = 200, prefix_lens: tuple[int, ...] = PREFIX_LENS) -> StdServingInfo:
    """Fit the per-visit host time over `prefix_lens` (clamped at zero: a negative slope is noise)."""
    ms = [visit_ms(n, visits) for n in prefix_lens]
    fit = linregress([n / 1000.0 for n in prefix_lens], ms)
    slope = max(float(fit.slope), 0.0)
    base = max(min(ms) if slope == 0.0 else float(fit.intercept), 0.0)
    return StdServingInfo(hop_overhead_ms=round(base, 6), hop_overhead_ms_per_ktok=round(slope, 6))
