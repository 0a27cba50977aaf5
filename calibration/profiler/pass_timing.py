"""Time the engine's passes alone on its device: decode graphs, varlen graphs and eager passes over a grid. A point
(a batch with real KV pages, stepped until `Timing` is met) keeps the median GPU time, the p10-p90 spread and the
path the engine took, so it is filed under the pass that actually ran.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenrouter.calibration.measured import PassPoint
from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request

# Long-context points: the contexts 8,192-token outputs reach (the curve's long cells), which serving at 1k never tests
LONG_CTX = 4096
LONG_CTX_MAX_TOKENS = 128  # varlen buckets up to this many tokens (about ten returns) get a LONG_CTX point
RETURN_ROW_TOKENS = 12  # a peer return as the 32B sees one at hop rate ~0.1: longer than a decode graph row


@dataclass(frozen=True, slots=True)
class Grid:
    """What to measure for one model. `decode`: (bucket, context per row); `varlen`/`eager`: (tokens, mix,
    context per row) with mix "returns" (rows of RETURN_ROW_TOKENS tokens) or "prefill" (one row) or "decode"."""

    decode: tuple[tuple[int, int], ...]
    decode_held: tuple[tuple[int, int], ...]
    varlen: tuple[tuple[int, str, int], ...]
    varlen_held: tuple[tuple[int, str, int], ...]
    eager: tuple[tuple[int, str, int], ...]
    eager_held: tuple[tuple[int, str, int], ...]

    @classmethod
    def default(cls, decode_buckets: Iterable[int], varlen_buckets: Iterable[int], *, quick: bool = False,
                max_decode: int = 64, max_tokens: int = 2048) -> Grid:  # fmt: skip
        """The H200 grid: decode buckets at two contexts, varlen buckets in two mixes, eager passes from 1 to
        `max_tokens` tokens, held-out points between; `quick`: a handful of points (CPU tests)."""
        dec = [b for b in decode_buckets if b <= max_decode]
        var = [t for t in varlen_buckets if t <= max_tokens]
        if quick:
            dec, var = dec[:3], var[:2]
            return cls(tuple((b, c) for b in dec for c in (16, 48)), ((3, 32),),
                       tuple((t, "returns", 32) for t in var), ((20, "returns", 32),),
                       ((1, "decode", 32), (16, "returns", 32)), ((4, "decode", 32),))  # fmt: skip
        ctxs = (256, 2048)
        decode = tuple((b, c) for b in dec for c in ctxs)
        decode_held = tuple((t, 1024) for t in (3, 12, 40) if t <= max_decode)
        decode_held += ((8, 2 * LONG_CTX),) if max_decode >= 8 else ()
        # Returns again at LONG_CTX in the buckets peer returns fill: within one knot the context then varies among
        # rows like serving's, so the table's ctx slope is theirs (a prefill row's attention is another regime)
        varlen = (*((t, mix, 1024) for t in var for mix in ("returns", "prefill")),
                  *((t, "returns", LONG_CTX) for t in var if t <= LONG_CTX_MAX_TOKENS))  # fmt: skip
        varlen_held = (*((t, "returns", 1024) for t in (20, 40, 100, 300, 700, 1300) if t <= max_tokens),
                       *((t, "returns", 2 * LONG_CTX) for t in (40,) if t <= max_tokens))  # fmt: skip
        eager = (*((t, "decode", 1024) for t in (1, 4, 16, 64)),
                 *((t, "returns", 1024) for t in (32, 128, 512, max_tokens)))  # fmt: skip
        eager_held = ((8, "decode", 1024), (256, "returns", 1024))
        return cls(decode, decode_held, varlen, varlen_held, eager, eager_held)


@dataclass(frozen=True, slots=True)
class Timing:
    min_reps: int = 5
    max_reps: int = 60
    min_time_s: float = 0.2
    warmup: int = 2


def row_tokens(tokens: int, mix: str) -> list[int]:
    """Tokens per row of a pass of `tokens` tokens in `mix`."""
    if mix == "decode":
        return [1] * tokens
    if mix == "prefill":
        return [tokens]
    if mix == "returns":
        rows = [RETURN_ROW_TOKENS] * (tokens // RETURN_ROW_TOKENS)
        if tokens % RETURN_ROW_TOKENS:
            rows.append(tokens % RETURN_ROW_TOKENS)
        return rows
    raise ValueError(f"unknown mix {mix!r}")


class PassTimer:
    """Times passes on one engine. `engine` is a `tokenrouter.engine.Engine` (graphs captured as configured)."""

    def __init__(self, engine: Any, timing: Timing = Timing()) -> None:
        self.eng = engine
        self.timing = timing
        self.cuda = engine.device.type == "cuda"
        engine.timing = self.cuda
        self._n = 0

    def point(self, rows: list[int], ctx_per_row: int, *, graphs: bool = True) -> tuple[PassPoint, str]:
        """Measure one pass: rows of `rows[i]` tokens, each attending `max(ctx_per_row, rows[i])` tokens."""
        eng = self.eng
        ctxs = [max(ctx_per_row, n) for n in rows]
        reqs = []
        try:
            vocab = eng.spec.vocab_size
            for c in ctxs:
                self._n += 1
                req = Request(f"cal{self._n}", [(31 * j + self._n) % vocab for j in range(c)], c)
                if not eng.kv_pool.grow(req.pages, c):
                    raise RuntimeError(f"KV pool too small for {len(rows)} rows x {c} tokens")
                reqs.append(req)
            batch = Batch(0, 0, [BatchRow(r, c - n, n) for r, n, c in zip(reqs, rows, ctxs, strict=True)])
            eng.use_graphs = graphs
            times, path = self._time(batch)
        finally:
            eng.use_graphs = True
            for r in reqs:
                eng.kv_pool.release(r.pages)
        ms = statistics.median(times)
        q = statistics.quantiles(times, n=10) if len(times) >= 2 else [ms] * 9
        spread = (q[-1] - q[0]) / ms if ms > 0 else 0.0
        ext = sum(n for n in rows if n > 1)
        pp = PassPoint(tokens=sum(rows), rows=len(rows), context_tokens=sum(ctxs), extend_tokens=ext,
                       ms=round(ms, 6), spread=round(spread, 4))  # fmt: skip
        return pp, path

    def _step_ms(self, batch: Batch) -> tuple[float, str]:
        t0 = time.perf_counter()
        h = self.eng.step(batch)
        h.result()
        wall = (time.perf_counter() - t0) * 1e3
        timed = h.gpu_start is not None and h.gpu_end is not None
        ms = h.gpu_start.elapsed_time(h.gpu_end) if timed else wall
        if h.graph_bucket is not None:
            path = f"decode:{h.graph_bucket}"
        elif getattr(h, "varlen_bucket", None) is not None:
            path = f"varlen:{h.varlen_bucket}"
        else:
            path = "eager"
        return ms, path

    def _time(self, batch: Batch) -> tuple[list[float], str]:
        t = self.timing
        path = ""
        for _ in range(t.warmup):
            _, path = self._step_ms(batch)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < t.max_reps and (len(times) < t.min_reps or time.perf_counter() - start < t.min_time_s):
            ms, path = self._step_ms(batch)
            times.append(ms)
        return times, path


def kind_of(path: str) -> str:
    return path.split(":")[0]
