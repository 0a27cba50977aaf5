"""The serving loop's own time per step when nothing overlaps it, measured on the real pair in a real server
(step-sync, N = 1 then 8, step logs), which the bare loop (`model_worker.host_cost`) misses (docs/calibration.md).
A gap counts only where a model's step follows its own completion with nothing in flight.
"""

from __future__ import annotations

import gzip
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES = ((1, 6), (8, 16))  # (clients, requests): one row per step, then several
QUICK_PHASES = ((1, 2), (4, 4))
OUTPUT_LEN, QUICK_OUTPUT_LEN = 128, 32
MIN_STEPS, QUICK_MIN_STEPS = 20, 5  # gaps a batch size needs to count (fewer: a few stragglers' noise)


def _config(a: str, b: str, device: str) -> Any:
    from tokenrouter.core.config import (
        DeploymentConfig,
        ModelConfig,
        PlacementConfig,
        PolicyConfig,
        RouterConfig,
        SchedulerConfig,
    )
    from tokenrouter.core.names import Placement
    from tokenrouter.runtime.launcher import with_cpu_kv_tokens

    cfg = DeploymentConfig(models=[ModelConfig(a), ModelConfig(b)], placement=PlacementConfig(mode=Placement.MPS),
                           policy=PolicyConfig(kind="step-sync"), router=RouterConfig("r2r", hop_rate=0.1),
                           scheduler=SchedulerConfig(max_batch_size=64))  # fmt: skip
    return with_cpu_kv_tokens(cfg, 4096) if device == "cpu" else cfg


def _serve(cfg: Any, device: str, run_dir: Path, phases: tuple[tuple[int, int], ...], output_len: int,
           on_phase: Callable[[], None]) -> None:  # fmt: skip
    from tokenrouter.runtime import protocol as P
    from tokenrouter.runtime.client import RuntimeClient
    from tokenrouter.runtime.launcher import Server
    from tokenrouter.workloads import RequestSpec

    with Server(cfg, device=device, step_logs=True, run_dir=run_dir) as srv:
        client = RuntimeClient(srv.addresses)
        try:
            for n, total in phases:
                specs = [RequestSpec(f"gap{n}-{i}", 100, output_len, None) for i in range(total)]
                for s in specs[:n]:
                    _submit(client, s, output_len)
                for k in range(total):
                    if not client.until(lambda ev: isinstance(ev, P.Finished), 300):
                        raise RuntimeError(f"N = {n}: no request finished within 300 s")
                    if n + k < total:
                        _submit(client, specs[n + k], output_len)
                on_phase()
        finally:
            client.close()


def _submit(client: Any, spec: Any, output_len: int) -> None:
    from tokenrouter.runtime import protocol as P
    from tokenrouter.workloads import request_ids, request_seed

    sampling = P.Sampling(temperature=0.0, max_tokens=output_len, ignore_eos=True, seed=request_seed(spec, 0))
    client.submit(spec.rid, request_ids(spec, 0), sampling)


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    """Every subserver's step log in `run_dir`, in launch order."""
    steps: list[dict[str, Any]] = []
    for f in sorted(run_dir.rglob("steps*.jsonl*")):
        with gzip.open(f, "rt") if f.suffix == ".gz" else f.open() as fh:
            steps += [json.loads(line) for line in fh if line.strip()]
    return sorted(steps, key=lambda s: s["submitted"])


def own_gaps(steps: list[dict[str, Any]]) -> dict[int, dict[int, list[tuple[float, float | None]]]]:
    """model -> rows -> (gap, idle) in ms for steps that follow their own model's completion with nothing in flight.
    `gap`: that completion to this step's hand-over to the engine; `idle`: completion to completion less this
    step's GPU time (None without GPU times)."""
    out: dict[int, dict[int, list[tuple[float, float | None]]]] = {}
    last: dict[str, Any] | None = None  # the latest completion so far, of any model
    for s in steps:
        if last is not None and s["submitted"] >= last["done"] and last["model"] == s["model"]:
            gpu = s.get("gpu_ms") or 0.0
            idle = (s["done"] - last["done"]) * 1e3 - gpu if gpu > 0 else None
            out.setdefault(s["model"], {}).setdefault(s["rows"], []).append(((s["submitted"] - last["done"]) * 1e3,
                                                                              idle))  # fmt: skip
        if last is None or s["done"] > last["done"]:
            last = s
    return out


def handoff_idle(steps: list[dict[str, Any]]) -> dict[int, list[float]]:
    """model -> the GPU's idle time (ms) before each one-row step that follows another model's one-row step with
    nothing in flight (at N = 1 a hand-off); steps without GPU times give nothing."""
    out: dict[int, list[float]] = {}
    last: dict[str, Any] | None = None
    for s in steps:
        gpu = s.get("gpu_ms") or 0.0
        if (last is not None and gpu > 0 and s["submitted"] >= last["done"] and last["model"] != s["model"]
                and s["rows"] == 1 and last["rows"] == 1):  # fmt: skip
            out.setdefault(s["model"], []).append((s["done"] - last["done"]) * 1e3 - gpu)
        if last is None or s["done"] > last["done"]:
            last = s
    return out


def summarize(gaps: dict[int, dict[int, list[tuple[float, float | None]]]], names: tuple[str, str],
              min_steps: int = MIN_STEPS) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Per model name, one record per batch size seen at least `min_steps` times: {"rows", "gap_ms", "idle_ms"
    (medians; idle_ms only with GPU times), "steps"}."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m, by_rows in sorted(gaps.items()):
        recs = out.setdefault(names[m], [])
        for r, g in sorted(by_rows.items()):
            if len(g) < min_steps:
                continue
            rec: dict[str, Any] = {"rows": r, "gap_ms": round(statistics.median(x for x, _ in g), 6), "steps": len(g)}
            idle = [y for _, y in g if y is not None]
            if idle:
                rec["idle_ms"] = round(statistics.median(idle), 6)
            recs.append(rec)
    return out


def measure(a: str, b: str, device: str, on_phase: Callable[[], None] = lambda: None, quick: bool = False,
            keep: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """For the pair (small `a`, large `b`): {"gaps": {model: [{"rows", "gap_ms", "idle_ms", "steps"}]},
    "handoffs": {model: {"idle_ms", "steps"}}, "policy", "phases"}; `keep`: a folder for the step logs (gzipped)."""
    phases = QUICK_PHASES if quick else PHASES
    min_steps = QUICK_MIN_STEPS if quick else MIN_STEPS
    with tempfile.TemporaryDirectory(prefix="trcal-serve-") as d:
        _serve(_config(a, b, device), device, Path(d), phases, QUICK_OUTPUT_LEN if quick else OUTPUT_LEN, on_phase)
        steps = read_steps(Path(d))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for f in Path(d).rglob("steps*.jsonl"):
                (keep / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes()))
    names = (a, b)
    handoffs = {names[m]: {"idle_ms": round(statistics.median(v), 6), "steps": len(v)}
                for m, v in sorted(handoff_idle(steps).items()) if len(v) >= min_steps}  # fmt: skip
    return {"gaps": summarize(own_gaps(steps), names, min_steps), "handoffs": handoffs, "policy": "step-sync",
            "phases": [list(p) for p in phases]}  # fmt: skip
