"""One model alone on the device, in a process of its own: its passes, its learned routers' device parts and the
loop's host time per step, each sent as measured. Messages: ("info", dict) once the engine is up; ("point", id,
record); ("router", name, record); ("host", key, record); ("deadline", id); ("done", None); ("error", text).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokenrouter.calibration.profiler.pass_timing import Grid, PassTimer, Timing, kind_of, row_tokens
from tokenrouter.calibration.profiler.std_serving import measure_std_serving

ROUTER_BATCHES = (1, 8, 32)
HOST_BATCHES = (1, 8)
# --quick (a check of the tool, on CPU in minutes): the router's line through two batch sizes, a shorter host loop
QUICK_ROUTER_BATCHES = (1, 8)
QUICK_HOST_STEPS = 20


@dataclass(slots=True)
class ModelJob:
    """What one worker measures. `grid_args`: `Grid.default`'s options; `done`: ids measured by an earlier run;
    `small`: the entry model (the learned routers read it); `probe_gpu`: also report the device (`probe_device`)."""

    model: str
    engine_kwargs: dict[str, Any]
    grid_args: dict[str, Any]
    routers: tuple[str, ...] = ()
    small: bool = True
    deadline: float = float("inf")  # monotonic: stop before starting work that would pass it
    done: set[str] = field(default_factory=set)
    timing: Timing = field(default_factory=Timing)
    probe_gpu: bool = False


def point_plan(grid: Grid) -> list[tuple[str, str, list[int], int, bool, bool]]:
    """(id, intended kind, rows, context per row, graphs, held out) for every point of `grid`."""
    plan = []
    for held, pts in ((False, grid.decode), (True, grid.decode_held)):
        for b, c in pts:
            plan.append((f"decode{'-held' if held else ''}/{b}x{c}", "decode", [1] * b, c, True, held))
    for held, pts in ((False, grid.varlen), (True, grid.varlen_held)):
        for t, mix, c in pts:
            plan.append((f"varlen{'-held' if held else ''}/{t}/{mix}/{c}", "varlen", row_tokens(t, mix), c, True, held))
    for held, pts in ((False, grid.eager), (True, grid.eager_held)):
        for t, mix, c in pts:
            plan.append((f"eager{'-held' if held else ''}/{t}/{mix}/{c}", "eager", row_tokens(t, mix), c, False, held))
    return plan


def model_worker(conn: Any, job: ModelJob) -> None:
    """Process entry (multiprocessing spawn target)."""
    try:
        from tokenrouter.engine import Engine, EngineConfig

        t0 = time.monotonic()
        eng = Engine(EngineConfig(**job.engine_kwargs))
        vs = eng.varlen_shapes
        decode_buckets = list(eng.config.graph_buckets) if eng.graphs is not None else []
        varlen_buckets = list(vs.buckets) if vs is not None and eng.vgraphs is not None else []
        grid = Grid.default(decode_buckets or [1, 2, 4, 8, 16, 32, 64], varlen_buckets or [16, 32, 64, 128],
                            **job.grid_args)  # fmt: skip
        info = {
            "startup_s": time.monotonic() - t0, "device": str(eng.device), "decode_buckets": decode_buckets,
            "varlen_buckets": varlen_buckets, "varlen_max_pad": vs.max_pad if vs is not None else None,
            "varlen_long_rows": eng.config.varlen_long_rows, "max_row_tokens": eng.config.graph_max_row_tokens,
            "capture": dict(eng.capture_stats), "points": len(point_plan(grid)),
        }  # fmt: skip
        if job.probe_gpu:
            info["env"] = probe_device(eng.device)
        conn.send(("info", info))
        timer = PassTimer(eng, job.timing)
        base: dict[int, float] = {}
        for pid, kind, rows, ctx, graphs, held in point_plan(grid):
            if pid in job.done:
                continue
            if time.monotonic() > job.deadline:
                conn.send(("deadline", pid))
                return
            pp, path = timer.point(rows, ctx, graphs=graphs)
            rec = {**{f: getattr(pp, f) for f in pp.__struct_fields__}, "held_out": held, "path": path,
                   "intended": kind, "ran": kind_of(path) if graphs else "eager"}  # fmt: skip
            conn.send(("point", pid, rec))
        quick = bool(job.grid_args.get("quick"))
        for b in (QUICK_ROUTER_BATCHES if quick else ROUTER_BATCHES) if job.routers else ():
            base[b] = timer.point([1] * b, 1024)[0].ms
        for name in job.routers:
            if f"router/{name}" in job.done:
                continue
            if time.monotonic() > job.deadline:
                conn.send(("deadline", f"router/{name}"))
                return
            conn.send(("router", name, router_cost(eng, timer, name, job.small, base)))
        eng.set_router(None) if job.routers else None
        for b in HOST_BATCHES:
            for overlap in (False, True):
                key = f"host/{b}/{'overlap' if overlap else 'sync'}"
                if key in job.done:
                    continue
                if time.monotonic() > job.deadline:
                    conn.send(("deadline", key))
                    return
                conn.send(("host", key, host_cost(eng, b, overlap, QUICK_HOST_STEPS if quick else 60)))
        eng.close()
        conn.send(("done", None))
    except BaseException as e:  # the calibrator records the failure and goes on with other tasks
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def router_cost(eng: Any, timer: PassTimer, name: str, small: bool, base: dict[int, float]) -> dict[str, Any]:
    """A learned router's device part: decode steps with it inside the step minus without (random weights)."""
    from tokenrouter.routers.learned import make_learned_router

    model = 0 if small else 1
    router = make_learned_router(name, "random", 0.1, eng.spec.hidden_size, eng.spec.vocab_size, eng.device,
                                 model=model, num_models=2,
                                 embedding=eng.model.embed_tokens if small else None).bind(model, 2)  # fmt: skip
    eng.set_router(router.device)
    out = {}
    for b, ms in base.items():
        with_router = timer.point([1] * b, 1024)[0].ms
        out[str(b)] = {"with_ms": with_router, "without_ms": ms}
    return out


def host_cost(eng: Any, rows: int, overlap: bool, steps: int = 60) -> dict[str, Any]:
    """The serving loop's own time per step: `rows` requests decoding through the runtime's `EngineLoop`
    (in process), loop period against the GPU time of the same back-to-back steps."""
    from tokenrouter.core.request import Request, SamplingParams
    from tokenrouter.core.router import Router
    from tokenrouter.core.scheduler import Scheduler
    from tokenrouter.runtime.local_loop import LocalLoop

    sched = Scheduler(0, 2, kv=eng.kv_pool, router=Router(), max_batch_size=eng.max_batch_size,
                      max_batch_tokens=max(64, rows * 16), overlap=overlap)  # fmt: skip
    vocab = eng.spec.vocab_size
    for i in range(rows):
        req = Request(f"host{rows}-{overlap}-{i}", [(7 * j + i) % vocab for j in range(16)], 16,
                      SamplingParams(max_tokens=steps + 40, ignore_eos=True))  # fmt: skip
        sched.add(req, time.monotonic())
    LocalLoop(eng, sched).run(max_steps=8)  # prefill and warm
    loop = LocalLoop(eng, sched)
    loop.run(max_steps=steps)
    c = loop.counters
    n = max(c.loop_steps, 1)
    gpu = c.loop_gpu_ms / n if c.loop_gpu_ms else None
    return {"rows": rows, "overlap": overlap, "steps": c.loop_steps, "loop_ms": c.loop_ms / n, "gpu_ms": gpu,
            "step_host_ms": 1e3 * loop.times.step_s / max(loop.launched, 1),
            "schedule_ms": 1e3 * loop.times.schedule_s / max(loop.launched, 1),
            "complete_ms": 1e3 * loop.times.complete_s / max(loop.launched, 1)}  # fmt: skip


def probe_device(device: Any) -> dict[str, Any]:
    """The device and software the profile is valid for, and the two ceilings: copy bandwidth (read + write)
    and dense bf16 matmul rate, each the median of 10 timed runs (CUDA events) after warm-up."""
    import platform

    import torch

    env: dict[str, Any] = {"versions": {"torch": str(torch.__version__), "python": platform.python_version()}}
    try:
        import triton

        env["versions"]["triton"] = str(triton.__version__)
    except ImportError:
        pass
    # Host-side, device-independent: standard serving's prefix-cache cost per returning hop on this machine.
    env["std_serving"] = msgspec.structs.asdict(measure_std_serving())
    if device.type != "cuda":
        env["gpu"] = f"cpu ({platform.processor() or platform.machine()})"
        return env
    props = torch.cuda.get_device_properties(device)
    env.update(gpu=props.name, memory_gb=props.total_memory / 1e9, sm_count=props.multi_processor_count)
    env["versions"]["cuda"] = str(torch.version.cuda)

    def timed(fn: Any, *args: Any) -> float:
        for _ in range(3):
            fn(*args)
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(*args)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    src = torch.randn(2**29, device=device, dtype=torch.bfloat16)  # 1 GiB
    env["copy_gbs"] = 2 * src.numel() * 2 / (timed(torch.empty_like(src).copy_, src) / 1e3) / 1e9
    x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    env["matmul_tflops"] = 2 * 8192**3 / (timed(torch.matmul, x, x.T.contiguous()) / 1e3) / 1e12
    torch.cuda.empty_cache()
    return env
