"""`tr calibrate`: profile the engine on the GPU it runs on and write a measured profile (docs/calibration.md).
The calibrator never starts CUDA: every measurement runs in a spawned worker; what they report is kept in
`OUT.partial.json` (the same command resumes a cut run) until `assemble` fits it into the profile.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenrouter.calibration.profiler.corun import WindowSpec, corun_worker, engine_kwargs_for_corun
from tokenrouter.calibration.profiler.model_worker import ModelJob, model_worker
from tokenrouter.calibration.profiler.pass_timing import Timing
from tokenrouter.core.names import RouterName
from tokenrouter.models import load_spec
from tokenrouter.runtime.spawn import start_spawned

PARTIAL_FORMAT = "tokenrouter-calibration-partial/1"
CELL_STEPS, CELL_STEPS_QUICK = 20, 10  # steps of the slower side a co-run cell's window is sized for
ROUTERS = tuple(r.value for r in (RouterName.R2R, RouterName.CITER, RouterName.CO_LLM, RouterName.R_STITCH))


def colocated_pairs(models: list[str], given: list[list[str]]) -> list[tuple[str, str]]:
    """The (small, large) pairs to measure side by side: `given` (names resolved), else the first of `models` with
    each other one."""
    if any(len(p) != 2 for p in given):
        raise ValueError("--pair takes SMALL,LARGE")
    pairs = [(load_spec(a).name, load_spec(b).name) for a, b in given] or [(models[0], n) for n in models[1:]]
    missing = {m for p in pairs for m in p} - set(models)
    if missing:
        raise ValueError(f"--pair names {', '.join(sorted(missing))}, which no --model gives")
    return pairs


@dataclass(slots=True)
class Plan:
    """What one calibration measures. `pairs`: (small, large) co-located under MPS at every split of `splits`
    (the first 100/100, the reference); `corun_*`: the co-run grid's passes (`corun.pass_rows`), held-out cells
    and context per row."""

    models: list[str]
    pairs: list[tuple[str, str]] = field(default_factory=list)
    splits: list[tuple[int, int]] = field(default_factory=lambda: [(100, 100)])
    corun_batches_a: list[int] = field(default_factory=lambda: [1, 4, 16, 32, 64])
    corun_batches_b: list[int] = field(default_factory=lambda: [1, 4, 16, 64, 128, 256, 512])
    corun_held: list[tuple[int, int]] = field(default_factory=lambda: [(2, 8), (8, 2)])
    corun_context: int = 1024
    routers: list[str] = field(default_factory=lambda: list(ROUTERS))
    arrangements: list[str] = field(default_factory=list)  # one-process alternatives to MPS (`arrangement`)
    max_tokens: int = 2048
    max_decode: int = 64
    device: str = "cuda"
    quick: bool = False

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("give at least one --model")
        if self.pairs and self.splits[0] != (100, 100):
            raise ValueError("the first SM split must be 100/100 (the reference every slowdown is relative to)")
        for a, b in self.pairs:
            if a == b:
                raise ValueError(f"a co-located pair needs two models, got {a}|{b}")
        from tokenrouter.calibration.profiler.arrangement import ARRANGEMENTS

        bad = [x for x in self.arrangements if x not in ARRANGEMENTS]
        if bad:
            raise ValueError(f"unknown arrangement {bad[0]!r}; choose from {', '.join(ARRANGEMENTS)}")

    def tasks(self) -> list[str]:
        """Task ids in measuring order: the pairs' models, their co-runs, the other models, each pair's serving loop
        (after the co-runs' MPS daemon is gone), then the runtime's own costs (cheapest to lose to a deadline)."""
        first = [m for p in self.pairs for m in p]
        order = list(dict.fromkeys([*first, *self.models]))
        out = [f"model/{m}" for m in order if m in first]
        out += [f"corun/{a}|{b}/{sa}-{sb}" for a, b in self.pairs for sa, sb in self.splits]
        out += [f"arrangement/{a}|{b}/{name}" for a, b in self.pairs for name in self.arrangements]
        out += [f"model/{m}" for m in order if m not in first]
        return [*out, *(f"serving/{a}|{b}" for a, b in self.pairs), "runtime"]

    def small_models(self) -> set[str]:
        """Models whose learned routers' device parts are measured: the pairs' small models (or the first)."""
        return {a for a, _ in self.pairs} or {self.models[0]}


@dataclass(slots=True)
class Calibration:
    """One `tr calibrate` run: plan, output, partial results, deadline."""

    plan: Plan
    out: Path
    command: str
    deadline_s: float | None = None
    on_event: Callable[[str, str, int, int], None] = lambda task, what, done, total: None
    partial: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    @property
    def partial_path(self) -> Path:
        return self.out.with_name(self.out.name + ".partial.json")

    def load(self) -> None:
        """Resume from an earlier run of the same plan (a different plan is an error, not silently mixed)."""
        p = self.partial_path
        fresh = {"format": PARTIAL_FORMAT, "command": self.command, "created": datetime.now().isoformat(
            timespec="seconds"), "plan": asdict(self.plan), "env": {}, "results": {}, "failed": {}}  # fmt: skip
        if not p.exists():
            self.partial = fresh
            return
        try:
            old = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{p}: cannot read the partial calibration ({e}); delete it to start over") from None
        if old.get("format") != PARTIAL_FORMAT:
            raise ValueError(f"{p}: not a calibration partial of this version; delete it to start over")
        if _plan_key(old.get("plan", {})) != _plan_key(asdict(self.plan)):
            raise ValueError(f"{p}: an earlier calibration with another plan; finish it with its own command "
                             f"({old.get('command', '?')}) or delete it")  # fmt: skip
        old["failed"] = {}  # failed tasks are tried again
        old["plan"] = asdict(self.plan)
        self.partial = old

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.partial_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.partial, indent=1))
        tmp.replace(self.partial_path)

    @property
    def deadline(self) -> float:
        return self.t0 + self.deadline_s if self.deadline_s is not None else float("inf")

    def pending(self) -> list[str]:
        res = self.partial["results"]
        return [t for t in self.plan.tasks() if not res.get(t, {}).get("complete")]

    def run(self) -> bool:
        """Measure every pending task (until the deadline); True when all are done."""
        self.load()
        self.partial["env"].setdefault("host", _host_info())
        own_server = ("serving/", "runtime")
        try:
            with self._mps() as mps_env:
                self._run_tasks([t for t in self.pending() if not t.startswith(own_server)], mps_env)
            self._run_tasks([t for t in self.pending() if t.startswith(own_server)], {})
        finally:
            self.save()  # also on Ctrl-C: the points of the task it cut are kept for the resume
        return not self.pending()

    def _run_tasks(self, tasks: list[str], mps_env: dict[str, str]) -> None:
        for task in tasks:
            if time.monotonic() > self.deadline:
                return
            self.on_event(task, "start", 0, 0)  # a worker may take a while to report: show the task at once
            try:
                if task.startswith("model/"):
                    self._model(task, task.split("/", 1)[1])
                elif task.startswith(("corun/", "arrangement/")):
                    self._corun(task, mps_env)
                elif task.startswith("serving/"):
                    self._serving(task)
                else:
                    self._runtime(task)
            except Exception as e:  # record and go on: other tasks may still be measured
                self.partial["failed"][task] = f"{type(e).__name__}: {e}"
                self.on_event(task, "failed", 0, 0)
            self.save()

    def _model(self, task: str, model: str) -> None:
        p = self.plan
        raw = self.partial["results"].setdefault(task, {"points": {}, "routers": {}, "host": {}})
        grid_args = {"quick": p.quick, "max_decode": p.max_decode, "max_tokens": p.max_tokens}
        # The large model runs a device part only for R-Stitch (its entropy decides when to hand back).
        large = tuple(r for r in p.routers if r == RouterName.R_STITCH)
        routers = tuple(p.routers) if model in p.small_models() else large
        done = set(raw["points"]) | {f"router/{n}" for n in raw["routers"]} | set(raw["host"])
        job = ModelJob(model, self._engine_kwargs(model), grid_args, routers, model in p.small_models(),
                       deadline=self.deadline, done=done, timing=Timing(min_time_s=0.05, min_reps=3) if p.quick
                       else Timing(), probe_gpu=not self.partial["env"].get("gpu"))  # fmt: skip
        total, count = len(done) + len(routers) + 4, len(done)
        for msg in _worker(model_worker, (job,), env={}):
            kind = msg[0]
            if kind == "info":
                raw["info"] = msg[1]
                total = msg[1]["points"] + len(routers) + 4
                self.partial["env"].update(msg[1].get("env") or {})
            elif kind in ("point", "router", "host"):
                raw[{"point": "points", "router": "routers", "host": "host"}[kind]][msg[1]] = msg[2]
            elif kind == "done":
                raw["complete"] = True
            elif kind == "deadline":
                break
            elif kind == "error":
                raise RuntimeError(msg[1])
            count += kind in ("point", "router", "host")
            self.on_event(task, kind, count, total)
            if kind in ("point", "router", "host") and count % 8 == 0:
                self.save()

    def _engine_kwargs(self, model: str) -> dict[str, Any]:
        p = self.plan
        kw: dict[str, Any] = {"model": model, "load_format": "dummy", "device": p.device, "seed": 0,
                              "max_num_batched_tokens": p.max_tokens, "max_batch_size": 256}  # fmt: skip
        if p.device == "cpu":
            kw.update(num_pages=4096, cuda_graphs=False)
        else:
            kw["gpu_memory_utilization"] = 0.85
        return kw

    def _corun(self, task: str, mps_env: dict[str, str]) -> None:
        p = self.plan
        kind, pair, split = task.split("/")
        a, b = pair.split("|")
        raw: dict[str, Any] = {"batches_a": p.corun_batches_a, "batches_b": p.corun_batches_b,
                               "context": p.corun_context, "alone_a": {}, "alone_b": {}, "corun": {},
                               "held": {}}  # fmt: skip
        grid = [(x, y) for x in p.corun_batches_a for y in p.corun_batches_b]
        cells = [*(("alone_a", x, None) for x in p.corun_batches_a), *(("alone_b", None, y) for y in p.corun_batches_b),
                 *(("corun", x, y) for x, y in grid), *(("held", x, y) for x, y in p.corun_held)]  # fmt: skip
        if kind == "arrangement":
            runner: Any = _OneProcessPair(a, b, split, p)
        else:
            sa, sb = (int(x) for x in split.split("-"))
            runner = _CoRunPair(a, b, sa, sb, p, mps_env)
        with runner as pair_run:
            raw["startup_s"] = pair_run.startup
            raw["detail"] = getattr(pair_run, "detail", {})
            for n, (key, x, y) in enumerate(cells, 1):
                if x is not None and y is not None and time.monotonic() > self.deadline:
                    return
                got = pair_run.cell(x, y)
                if key == "alone_a":
                    raw[key][str(x)] = got["a"]
                elif key == "alone_b":
                    raw[key][str(y)] = got["b"]
                else:
                    raw[key][f"{x},{y}"] = got
                self.on_event(task, "cell", n, len(cells))
        raw["complete"] = True
        self.partial["results"][task] = raw

    def _ticker(self, task: str, what: str, total: int) -> Callable[[], None]:
        """A callback that reports one more of `total` steps of `task`."""
        n = itertools.count(1)
        return lambda: self.on_event(task, what, next(n), total)

    def _serving(self, task: str) -> None:
        from tokenrouter.calibration.profiler import serving_gap

        a, b = task.split("/", 1)[1].split("|")
        tick = self._ticker(task, "phase", len(serving_gap.PHASES))
        keep = self.out.with_name(f"{self.out.name}.serving")  # the step logs, beside the output
        gaps = serving_gap.measure(a, b, self.plan.device, tick, quick=self.plan.quick, keep=keep)
        self.partial["results"][task] = {**gaps, "complete": True}

    def _runtime(self, task: str) -> None:
        from tokenrouter.calibration.profiler import runtime_costs

        self.partial["results"][task] = {**runtime_costs.measure(self._ticker(task, "cost", 4)), "complete": True}

    @contextmanager
    def _mps(self) -> Iterator[dict[str, str]]:
        if self.plan.device == "cpu" or not self.plan.pairs:
            yield {}
            return
        from tokenrouter.runtime.mps import MpsDaemon

        with tempfile.TemporaryDirectory(prefix="trcal-mps-") as d:
            daemon = MpsDaemon(d)
            daemon.start()
            try:
                yield daemon.environment()
            finally:
                daemon.stop()


class _Pair:
    """A pair's measuring workers; a subclass's `run` steps them over one window."""

    def __init__(self, plan: Plan) -> None:
        self.quick = plan.quick
        self.est = {"a": 0.0, "b": 0.0}
        self.startup: dict[str, float] = {}

    def cell(self, x: int | None, y: int | None) -> dict[str, float]:
        return measure_cell(self, x, y, CELL_STEPS_QUICK if self.quick else CELL_STEPS)


class _CoRunPair(_Pair):
    """Two co-run workers (one per model of a pair) and the cells they run together or alone."""

    def __init__(self, a: str, b: str, share_a: int, share_b: int, plan: Plan, mps_env: dict[str, str]) -> None:
        super().__init__(plan)
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        ctx = mp.get_context("spawn")
        for model, share, batches in ((a, share_a, plan.corun_batches_a), (b, share_b, plan.corun_batches_b)):
            env = dict(mps_env)
            if share < 100 and plan.device != "cpu":
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
            mine, theirs = ctx.Pipe()
            held = [x for x, _ in plan.corun_held] if model == a else [y for _, y in plan.corun_held]
            all_batches = sorted({*batches, *held})
            kw = engine_kwargs_for_corun(model, all_batches, plan.corun_context, plan.device)
            if plan.device == "cpu":
                kw["cuda_graphs"] = False
            proc = start_spawned(corun_worker, (theirs, kw, all_batches, plan.corun_context),
                                 name=f"trcal-corun-{model}", daemon=True, env=env)  # fmt: skip
            self.procs.append(proc)
            self.conns.append(mine)

    def __enter__(self) -> _CoRunPair:
        for name, conn in zip(("a", "b"), self.conns, strict=True):
            msg = _recv(conn, 900)
            if msg[0] != "ready":
                raise RuntimeError(f"co-run worker {name}: {msg[1]}")
            self.startup[name] = msg[1]["startup_s"]
        return self

    def __exit__(self, *exc: object) -> None:
        for conn in self.conns:
            with suppress(OSError):  # a worker that died already
                conn.send(("stop",))
        for proc in self.procs:
            _join(proc, 30)

    def run(self, x: int | None, y: int | None, length: float) -> dict[str, dict[str, float]]:
        """Both workers step over one window (or one alone)."""
        sides = [(k, c, b) for k, c, b in (("a", self.conns[0], x), ("b", self.conns[1], y)) if b is not None]
        start = time.monotonic() + 0.05
        for _k, conn, b in sides:
            conn.send(("run", WindowSpec(start, start + length, b)))
        got = {}
        for k, conn, _b in sides:
            msg = _recv(conn, 120 + length)
            if msg[0] != "result":
                raise RuntimeError(f"co-run worker {k}: {msg[1]}")
            got[k] = msg[1]
        return got


class _OneProcessPair(_Pair):
    """Both models in one worker process (`arrangement`): stream priorities or green-context SM partitions."""

    def __init__(self, a: str, b: str, name: str, plan: Plan) -> None:
        from tokenrouter.calibration.profiler.arrangement import arrangement_worker

        super().__init__(plan)
        self.detail: dict[str, int] = {}
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        batches = (plan.corun_batches_a + [x for x, _ in plan.corun_held],
                   plan.corun_batches_b + [y for _, y in plan.corun_held])  # fmt: skip
        self.t0 = time.monotonic()
        self.proc = start_spawned(arrangement_worker, (theirs, name, (a, b), batches, plan.corun_context, plan.device),
                                  daemon=True)  # fmt: skip

    def __enter__(self) -> _OneProcessPair:
        msg = _recv(self.conn, 900)
        if msg[0] != "ready":
            raise RuntimeError(f"arrangement worker: {msg[1]}")
        self.startup = {"both": time.monotonic() - self.t0}
        self.detail = msg[1]["detail"]
        return self

    def __exit__(self, *exc: object) -> None:
        with suppress(OSError):
            self.conn.send(("stop",))
        _join(self.proc, 30)

    def run(self, x: int | None, y: int | None, length: float) -> dict[str, dict[str, float]]:
        self.conn.send(("run", x, y, length))
        msg = _recv(self.conn, 120 + length)
        if msg[0] != "result":
            raise RuntimeError(f"arrangement worker: {msg[1]}")
        return msg[1]


def measure_cell(pair: Any, x: int | None, y: int | None, steps: int = 20) -> dict[str, float]:
    """One cell of a co-run grid: both models step back to back over one window (or one alone); medians in ms. A
    window too short for 40% of `steps` steps of the slower side is tried again three times longer (twice at most)."""
    keys = [k for k, b in (("a", x), ("b", y)) if b is not None]
    est = max([pair.est[k] for k in keys] + [1.0])
    length = 0.2 + steps * est * (2.0 if len(keys) == 2 else 1.0) / 1000
    for _ in range(3):
        got = pair.run(x, y, length)
        if min(r["steps"] for r in got.values()) >= max(2, round(0.4 * steps)):
            break
        length *= 3
    if min(r["steps"] for r in got.values()) == 0:
        raise RuntimeError(f"co-run cell {x},{y}: no step fit a window of {length / 3:.2f} s")
    for k, r in got.items():
        pair.est[k] = max(pair.est[k], r["ms"])
    return {k: r["ms"] for k, r in got.items()}


def _recv(conn: Any, timeout_s: float) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"no answer from a calibration worker within {timeout_s:.0f} s")
    return conn.recv()


def _worker(target: Callable[..., None], args: tuple, env: dict[str, str]) -> Iterator[Any]:
    """Run `target(conn, *args)` in a spawned process and yield what it sends until it ends."""
    mine, theirs = mp.get_context("spawn").Pipe()
    proc = start_spawned(target, (theirs, *args), daemon=True, env=env)
    theirs.close()
    last = ""
    try:
        while True:
            try:
                msg = mine.recv()
            except EOFError:
                if proc.exitcode not in (None, 0):
                    raise RuntimeError(f"calibration worker exited with code {proc.exitcode}") from None
                return
            last = msg[0]
            yield msg
            if last in ("done", "error", "deadline"):
                return
    finally:
        if last not in ("done", "error", "deadline"):  # cut short (Ctrl-C, an error): the worker, deaf to SIGINT,
            proc.kill()  # would measure on
        _join(proc, 60)


def _join(proc: Any, timeout_s: float) -> None:
    """Wait for a worker to end; kill it when it has not within `timeout_s`."""
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()


def _plan_key(plan: dict[str, Any]) -> str:
    """What must match to resume: everything but the arrangements, which only add tasks."""
    return json.dumps({k: v for k, v in plan.items() if k != "arrangements"}, sort_keys=True)


def _host_info() -> dict[str, Any]:
    """What the calibrator can learn without starting CUDA: the driver and GPUs from nvidia-smi, Python."""
    info: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
        info["nvidia_smi"] = out.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = []
    return info


def command_line(argv: list[str]) -> str:
    return shlex.join(["tr", *argv])
