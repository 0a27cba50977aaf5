"""Co-location in one process: the pair's two engines, each stepped by its own thread (a graph replay holds the
interpreter lock briefly), arranged by CUDA stream priority or green-context SM partitions instead of MPS.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tokenrouter.calibration.profiler.corun import DecodeLoop, WindowSpec, engine_kwargs_for_corun

ARRANGEMENTS = ("stream-priority", "green-context")


def arrangement_kwargs(name: str, sm_count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine options of (small, large): the small model's stream at the highest priority, or the SMs split between
    two green contexts (a third for the launch-bound small model: docs/calibration.md)."""
    if name == "stream-priority":
        return {"stream_priority": -3}, {"stream_priority": 0}
    if name == "green-context":
        small = max(8, (sm_count // 3) // 8 * 8)  # green contexts take SMs in groups of 8
        return {"green_context_sms": small}, {"green_context_sms": (sm_count - small) // 8 * 8}
    raise ValueError(f"unknown arrangement {name!r}; choose one of {', '.join(ARRANGEMENTS)}")


def arrangement_worker(conn: Any, name: str, models: tuple[str, str], batches: tuple[list[int], list[int]],
                       context: int, device: str) -> None:  # fmt: skip
    """Process entry: both engines, then answer ("run", x, y, length) with {"a", "b"} medians until ("stop",)."""
    try:
        import torch

        from tokenrouter.engine import Engine, EngineConfig

        sm = torch.cuda.get_device_properties(0).multi_processor_count if device != "cpu" else 0
        extra = arrangement_kwargs(name, sm) if device != "cpu" else ({}, {})
        loops = []
        for model, bs, kw in zip(models, batches, extra, strict=True):
            cfg = {**engine_kwargs_for_corun(model, bs, context, device), **kw}
            if device == "cpu":
                cfg["cuda_graphs"] = False
            loops.append(DecodeLoop(Engine(EngineConfig(**cfg)), sorted(set(bs)), context))
        detail = {f"{role}_{k}": v for role, d in zip(("small", "large"), extra, strict=True) for k, v in d.items()}
        conn.send(("ready", {"detail": detail}))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, x, y, length = msg
            start = time.monotonic() + 0.05
            out: dict[str, dict[str, float]] = {}

            def go(key: str, loop: DecodeLoop, b: int, out: dict = out, w: float = start, n: float = length) -> None:
                out[key] = loop.run(WindowSpec(w, w + n, b))

            threads = [threading.Thread(target=go, args=(k, lp, b)) for k, lp, b in
                       (("a", loops[0], x), ("b", loops[1], y)) if b is not None]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            conn.send(("result", out))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
