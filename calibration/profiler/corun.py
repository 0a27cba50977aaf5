"""Co-location: two models' passes on one GPU, each alone and while the other steps back to back, each model in a
process of its own (`corun_worker`, under MPS with its SM share) over the same window (`WindowSpec`). A grid value
is the tokens of a pass: up to `MAX_DECODE` a decode batch, above it peer returns in a varlen graph of exactly its
size (docs/calibration.md, `tr calibrate`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from tokenrouter.calibration.profiler.pass_timing import row_tokens
from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request

MAX_DECODE = 64  # grid values up to this are decode batches (the decode graphs' range); above, peer-return passes


def pass_rows(value: int) -> list[int]:
    """Tokens per row of the grid's pass `value` (see the module docstring)."""
    return [1] * value if value <= MAX_DECODE else row_tokens(value, "returns")


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """Step from `start` to `end` (monotonic seconds); keep steps that began after `start + settle_s` and ended
    before `end - tail_s` (both workers are surely stepping then)."""

    start: float
    end: float
    batch: int
    settle_s: float = 0.08
    tail_s: float = 0.05


def engine_kwargs_for_corun(model: str, batches: list[int], context: int, device: str, page_size: int = 16,
                            seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """A small engine: graphs at exactly the grid's passes, KV for every cell's rows at once (two processes share
    the GPU, so neither may size itself from the whole memory)."""
    rows = [len(pass_rows(b)) for b in set(batches)]
    returns = tuple(sorted({b for b in batches if b > MAX_DECODE}))
    pages = sum(rows) * (-(-context // page_size) + 1) + 8  # one request set per grid value, all kept
    return {"model": model, "load_format": "dummy", "device": device, "seed": seed, "page_size": page_size,
            "num_pages": pages, "max_batch_size": max(rows), "max_num_batched_tokens": max(*batches, 16),
            "graph_buckets": tuple(sorted({b for b in batches if b <= MAX_DECODE})), "varlen_graphs": bool(returns),
            "varlen_graph_buckets": returns or None}  # fmt: skip


class DecodeLoop:
    """Back-to-back passes of a fixed batch on one engine (one request set per grid value, `pass_rows`)."""

    def __init__(self, engine: Any, batches: list[int], context: int) -> None:
        self.eng = engine
        engine.timing = engine.device.type == "cuda"
        self.batches: dict[int, Batch] = {}
        vocab = engine.spec.vocab_size
        for b in sorted(set(batches)):
            rows = []
            for i, n in enumerate(pass_rows(b)):
                req = Request(f"co{b}-{i}", [(13 * j + i) % vocab for j in range(context)], context)
                if not engine.kv_pool.grow(req.pages, context):
                    raise RuntimeError(f"KV pool too small for a pass of {b} tokens at {context} tokens a row")
                rows.append(BatchRow(req, context - n, n))
            self.batches[b] = Batch(0, 0, rows)
        for b in self.batches:  # warm every bucket up once
            for _ in range(3):
                self._step(b)

    def _step(self, b: int) -> float:
        h = self.eng.step(self.batches[b])
        h.result()
        if h.gpu_start is not None and h.gpu_end is not None:
            return h.gpu_start.elapsed_time(h.gpu_end)
        return float("nan")

    def run(self, w: WindowSpec) -> dict[str, float]:
        """Step `w.batch` rows from w.start to w.end; median and count of the steps inside the window."""
        while time.monotonic() < w.start:
            time.sleep(min(0.002, max(0.0, w.start - time.monotonic())))
        kept: list[float] = []
        lo, hi = w.start + w.settle_s, w.end - w.tail_s
        while True:
            t0 = time.monotonic()
            if t0 >= w.end:
                break
            gpu = self._step(w.batch)
            t1 = time.monotonic()
            if t0 >= lo and t1 <= hi:
                kept.append(gpu if gpu == gpu else (t1 - t0) * 1e3)  # CPU: the host time
        if not kept:  # the window was too short for this batch: the calibrator retries with a longer one
            return {"ms": float("nan"), "steps": 0.0}
        return {"ms": statistics.median(kept), "steps": float(len(kept))}


def corun_worker(conn: Any, kwargs: dict[str, Any], batches: list[int], context: int) -> None:
    """Process entry: build the engine, answer ("run", WindowSpec) with {"ms", "steps"} until ("stop",)."""
    try:
        from tokenrouter.engine import Engine, EngineConfig

        t0 = time.monotonic()
        engine = Engine(EngineConfig(**kwargs))
        loop = DecodeLoop(engine, batches, context)
        conn.send(("ready", {"startup_s": time.monotonic() - t0}))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            conn.send(("result", loop.run(msg[1])))
        engine.close()
    except BaseException as e:  # report, then exit: the calibrator records the task as failed
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
