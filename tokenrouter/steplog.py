"""Step logs: one JSON line per step a model ran, written by the runtime (`tr serve --step-logs DIR`) and by the
simulator (`trsim run --step-logs DIR`) in one format, and the timeline summary that compares the two
(docs/runtime.md, "Step logs").

A record: `model`, `step`, `rows`, `launch` / `done` (seconds: the host's monotonic clock live, simulated time in
the simulator; `done` is when the loop saw the result), `gpu_ms` (the pass on the device: CUDA events live, 0 on
CPU; the simulated pass), `back_to_back`, `submitted`, `tokens`, `ext_rows` / `ext_tokens` (rows of more than one
token), `ctx` (context summed over rows), `row_tokens`, `row_ctx`, `graph` / `varlen` (the engine's bucket, or
None). The simulator adds `gpu_start` / `gpu_end`, the pass's own interval on its GPU.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenrouter.core.batch import Batch


def step_record(model: int, batch: Batch, *, launch: float, done: float, gpu_ms: float, back_to_back: bool,
                submitted: float | None, graph: Any = None, varlen: Any = None) -> dict[str, Any]:  # fmt: skip
    """One step log line: when the step ran and what it carried, so a study can price the same pass again."""
    toks = [r.num_tokens for r in batch.rows]
    ext = [t for t in toks if t > 1]
    row_ctx = [r.start + r.num_tokens for r in batch.rows]
    return {"model": model, "step": batch.step_id, "rows": len(toks), "launch": launch, "done": done,
            "gpu_ms": gpu_ms, "back_to_back": back_to_back, "submitted": submitted, "tokens": sum(toks),
            "ext_rows": len(ext), "ext_tokens": sum(ext), "ctx": sum(row_ctx), "row_tokens": toks,
            "row_ctx": row_ctx, "graph": graph, "varlen": varlen}  # fmt: skip


def write_step_logs(records: dict[int, list[dict[str, Any]]], out: str | Path) -> list[Path]:
    """`records` per model as `steps<model>.jsonl` in `out` (created); the paths written."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for model, recs in sorted(records.items()):
        p = d / f"steps{model}.jsonl"
        p.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
        paths.append(p)
    return paths


def load_step_logs(d: str | Path) -> dict[int, list[dict[str, Any]]]:
    """The records of every `steps<model>.jsonl` in `d`, per model, in launch order. A line cut short by a killed
    process is skipped. ValueError when `d` holds none."""
    out: dict[int, list[dict[str, Any]]] = {}
    for p in sorted(Path(d).glob("steps*.jsonl")):
        for line in p.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.setdefault(int(r["model"]), []).append(r)
    if not out:
        raise ValueError(f"no step logs (steps<i>.jsonl) in {d}")
    for recs in out.values():
        recs.sort(key=lambda r: r["launch"])
    return out


def device_interval(r: dict[str, Any]) -> tuple[float, float]:
    """When the step's pass ran on the device: the simulator's own interval; live, the `gpu_ms` that ended by
    `done` (the loop sees a pass end after it ends), never before `submitted` (the pass may start while the host
    still enqueues it: `launch` is when the enqueue returned); the host's [launch, done] when no GPU time was
    taken (CPU)."""
    if "gpu_start" in r:
        return float(r["gpu_start"]), float(r["gpu_end"])
    done = float(r["done"])
    if r.get("gpu_ms"):
        first = r.get("submitted")
        first = float(r["launch"]) if first is None else float(first)
        return max(first, done - float(r["gpu_ms"]) / 1000.0), done
    return float(r["launch"]), done


def union_s(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one of `intervals`."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= max(a, end):  # outside the window, or inside what is counted already
            continue
        total += b - max(a, end)
        end = b
    return total


@dataclass(slots=True)
class ModelTimeline:
    """One model's steps over a window: counts, means and the share of the window its passes held the device."""

    model: int
    steps: int
    rows_per_step: float
    tokens_per_step: float
    ext_tokens_per_step: float
    step_ms: float  # launch -> done on the host, mean
    device_ms: float  # the pass alone, mean (device_interval)
    busy_share: float  # of the window, this model's passes running
    gap_ms: float  # mean device idle of this model between its consecutive passes


@dataclass(slots=True)
class Timeline:
    """A window of a run's step logs: each model's `ModelTimeline` and the device time no model used (co-located
    models: their passes' union; `idle_share` of the window with no pass running)."""

    window_s: tuple[float, float]
    models: list[ModelTimeline]
    idle_share: float

    def rows(self) -> list[dict[str, Any]]:
        """One dict per model (for a table), each with the window's `idle_share`."""
        return [{"model": m.model, "steps": m.steps, "rows/step": m.rows_per_step, "tokens/step": m.tokens_per_step,
                 "ext tokens/step": m.ext_tokens_per_step, "step ms": m.step_ms, "device ms": m.device_ms,
                 "busy share": m.busy_share, "gap ms": m.gap_ms, "idle share": self.idle_share}
                for m in self.models]  # fmt: skip


def timeline(logs: dict[int, list[dict[str, Any]]], window: Sequence[float] | None = None) -> Timeline:
    """The summary of `logs` over `window` (seconds on the logs' clock; default: first launch to last done). A
    step counts when its pass ended inside the window; busy and idle time are cut to the window."""
    every = [r for recs in logs.values() for r in recs]
    if not every:
        raise ValueError("no steps")
    lo, hi = (min(r["launch"] for r in every), max(r["done"] for r in every)) if window is None else window
    if not hi > lo:
        raise ValueError(f"empty window {lo}..{hi}")
    span = hi - lo
    models = []
    for m, recs in sorted(logs.items()):
        ivs = [device_interval(r) for r in recs]
        inside = [(r, iv) for r, iv in zip(recs, ivs, strict=True) if lo <= iv[1] <= hi]
        n = len(inside)
        gaps = [max(0.0, b[0] - a[1]) for (_, a), (_, b) in itertools.pairwise(inside)]

        def mean(xs: Iterable[float], k: int = n) -> float:
            return sum(xs) / k if k else 0.0

        models.append(ModelTimeline(
            m, n, mean(r["rows"] for r, _ in inside), mean(r["tokens"] for r, _ in inside),
            mean(r["ext_tokens"] for r, _ in inside), 1000 * mean(r["done"] - r["launch"] for r, _ in inside),
            1000 * mean(b - a for _, (a, b) in inside), union_s(ivs, lo, hi) / span,
            1000 * mean(gaps, len(gaps))))  # fmt: skip
    busy = union_s((device_interval(r) for r in every), lo, hi)
    return Timeline((lo, hi), models, 1.0 - busy / span)
