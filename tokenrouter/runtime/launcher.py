"""`Server`: starts the subservers, the sync coordinator and the MPS daemon, waits for every `Ready`, stops it all
(docs/runtime.md). Invariant: after `stop()`, no process of this server runs and its run directory is gone."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq

from tokenrouter.core.config import DeploymentConfig, ModelConfig
from tokenrouter.deploy.placement import check_gpus
from tokenrouter.models import load_spec
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime import subserver
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.build import SubserverSpec
from tokenrouter.runtime.cluster import Cluster, ClusterOptions
from tokenrouter.runtime.hoptrace import merge_hop_logs
from tokenrouter.runtime.mps import MpsDaemon
from tokenrouter.runtime.preflight import check_launch
from tokenrouter.runtime.rundir import create_run_dir
from tokenrouter.runtime.sockets import send_once
from tokenrouter.runtime.spawn import start_spawned
from tokenrouter.runtime.supervision import StartupError, describe_exit
from tokenrouter.runtime.sync_coordinator import CoordinatorProcess
from tokenrouter.runtime.watch import Supervisor

log = logging.getLogger(__name__)


def with_cpu_kv_tokens(cfg: DeploymentConfig, tokens: int) -> DeploymentConfig:
    """On CPU: every model gets a KV capacity of `tokens` through `kv_budget_gb`, unless the config sets one."""

    def budget(m: ModelConfig) -> ModelConfig:
        if m.kv_budget_gb is not None:
            return m
        return replace(m, kv_budget_gb=tokens * load_spec(m.path or m.name).kv_bytes_per_token / 1e9)

    return replace(cfg, models=[budget(m) for m in cfg.models])


def gpu_memory_gb(gpu: int) -> float:
    """One GPU's memory from nvidia-smi (the launcher never starts CUDA itself: it would become an MPS client)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(gpu)],
                         capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    return float(out.stdout.strip().splitlines()[0]) * 1024**2 / 1e9


def check_step_log_dir(path: str | Path) -> Path:
    """`path` created, or ValueError when it already holds step logs (subservers append to theirs: two runs
    would mix in one file)."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ValueError(f"step logs go in a directory; {d} is a file")
    old = sorted(d.glob("steps*.jsonl")) + sorted(d.glob("visits.jsonl")) if d.is_dir() else []
    if old:
        raise ValueError(f"{d} already holds step logs ({old[0].name}); give an empty or new directory")
    d.mkdir(parents=True, exist_ok=True)
    return d


def heartbeat_timeout(timeout_s: float | None, stats_interval_s: float) -> float:
    """How long a ready subserver may be silent before it is hung: at least two Stats intervals (one late report is
    not a hang); by default 10 s, or 4 intervals if longer."""
    if timeout_s is not None and not timeout_s >= 2 * stats_interval_s:
        raise ValueError(f"the heartbeat timeout ({timeout_s} s) must be at least twice the Stats "
                         f"interval ({stats_interval_s} s)")  # fmt: skip
    return max(10.0, 4 * stats_interval_s) if timeout_s is None else timeout_s


class Server(Supervisor):
    def __init__(self, config: DeploymentConfig, *, device: str = "cpu", memory_gb: float | None = None,
                 run_dir: str | Path | None = None, seed: int = 0, record_hops: str | Path | None = None,
                 step_logs: bool | str | Path = False, engine_overrides: dict[str, Any] | None = None,
                 ready_timeout_s: float = 300.0, stats_interval_s: float = 0.5, restart_on_failure: bool = False,
                 cluster: ClusterOptions | None = None, heartbeat_timeout_s: float | None = None) -> None:  # fmt: skip
        """`cluster`: how a tcp deployment runs (defaults when None); `heartbeat_timeout_s`: see `heartbeat_timeout`;
        `step_logs`: each subserver writes a JSONL line per step (`step_log(i)`), in the run directory (True) or in
        this directory (a path: kept after stop; refused when it already holds step logs, which would mix runs)."""
        check_launch(config, device, restart_on_failure)
        check_gpus(config, device)  # a config built without the CLI's resolver: tp splits, one GPU per rank
        self.config, self.device, self.num_models, self.entry = config, device, len(config.models), config.entry
        self.t0 = time.monotonic()
        self.restart_on_failure = restart_on_failure
        log_dir = None if isinstance(step_logs, bool) else check_step_log_dir(step_logs)  # before anything is made
        self._own_dir = run_dir is None
        self.run_dir = create_run_dir() if run_dir is None else Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if memory_gb is None:
            memory_gb = gpu_memory_gb(config.models[0].gpus[0]) if device == "cuda" else 1.0
        self.memory_gb = memory_gb
        self.seed, self.record_hops, self.step_logs = seed, record_hops, bool(step_logs)
        self.step_log_dir = self.run_dir if log_dir is None else log_dir
        self.engine_overrides = engine_overrides or {}
        self.ready_timeout_s, self.stats_interval_s = ready_timeout_s, stats_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout(heartbeat_timeout_s, stats_interval_s)
        self.coordinator: CoordinatorProcess | None = None
        self.mps: MpsDaemon | None = None
        self._init_supervision()  # before `_bind`: a `Cluster` keeps its launcher's `processes` and `dead`
        self._bind(cluster, record_hops, step_logs)

    def _bind(self, cluster: ClusterOptions | None, record_hops: str | Path | None, step_logs: bool) -> None:
        """Bind the launcher's PULL and set `addresses` (ipc, or tcp through `runtime.cluster`)."""
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self.cluster: Cluster | None = None
        if cluster is None and self.config.transport != "tcp":
            self.addresses = Addresses.local(self.run_dir, self.num_models)
            self._pull.bind(self.addresses.launcher)
            return
        try:
            self.cluster = Cluster(self, cluster or ClusterOptions(), self._ctx)
            if (record_hops or step_logs) and not self.cluster.local:
                raise ValueError("--record-hops and step logs are written into the run directory: they need "
                                 "every subserver on this host")  # fmt: skip
            self.addresses = self.cluster.bind_launcher(self._pull)
        except BaseException:
            if self.cluster is not None:
                self.cluster.close()
            self._pull.close(linger=0)
            self._ctx.term()
            raise
        self.add_listener(self.cluster.on_control)

    def hop_log(self, model: int) -> Path:
        return self.run_dir / f"hops{model}.jsonl"

    def step_log(self, model: int) -> Path:
        return self.step_log_dir / f"steps{model}.jsonl"

    def hop_logs(self) -> list[Path]:
        """The emit logs `record_hops` merges into the hop trace on stop (a hook)."""
        return [self.hop_log(i) for i in range(self.num_models)]

    # ---- what the HTTP front-end reads (`frontend.handle.ServerHandle`) -----------------------------------
    @property
    def model_names(self) -> list[str]:
        return [m.name for m in self.config.models]

    @property
    def kv_capacity_tokens(self) -> list[int]:
        """From each subserver's `Ready` (0 until it arrived; `start()` waits for all of them)."""
        return [self.ready[i].kv_capacity_tokens if i in self.ready else 0 for i in range(self.num_models)]

    @property
    def max_context_len(self) -> int:
        return min((r.max_context_len for r in self.ready.values()), default=0)

    @property
    def vocab_size(self) -> int:
        return min((r.vocab_size for r in self.ready.values()), default=0)

    def is_alive(self, i: int) -> bool:
        """Cheap and non-blocking: the process runs and never reported a failure."""
        return i not in self.dead and i < len(self.processes) and self.processes[i].exitcode is None

    def start(self) -> Server:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        sync = self.config.policy.is_sync
        if sync and self.cluster is None:
            self._start_coordinator()
        self._env_common: dict[str, str] = {}
        if self.device == "cuda" and self.config.placement.mode == "mps":
            self.mps = MpsDaemon(self.run_dir)
            self.mps.start()
            self._env_common = self.mps.environment()
        names = ", ".join(m.name for m in self.config.models)
        log.info("starting %d subservers (%s) on %s; run directory %s", self.num_models, names, self.device,
                 self.run_dir)  # fmt: skip
        for i in range(self.num_models):
            self._spawn(i, self.processes.append)
        if self.cluster is not None:  # tcp: the coordinator connects to the subservers' published endpoints
            self.cluster.wait_joined()
            if sync:
                self._start_coordinator()
            self.cluster.welcome_all()
        self.start_aux()
        self._wait_ready()
        self._watcher = threading.Thread(target=self._watch, name="tokenrouter-watch", daemon=True)
        self._watcher.start()

    def _start_coordinator(self) -> None:
        a = self.addresses
        self.coordinator = CoordinatorProcess(self.config.policy.kind, self.num_models, a.bind(a.coordinator),
                                              a.subservers)  # fmt: skip

    # ---- hooks of a server that runs other processes (`baselines.launcher.BaselineServer`) --------------------
    def start_aux(self) -> None:
        """Start processes beside the subservers (before their Ready is awaited) into `aux` as (name, process,
        address): an exit fails the server, `stop` sends `Shutdown` to the address. None here."""

    def subserver_target(self, spec: SubserverSpec) -> tuple[Callable[[Any], None], Any]:
        """Entry point and (picklable) argument of subserver `spec.model`'s process: it sends `Ready`, then `Stats`
        every `stats_interval_s`, and stops on `Shutdown`, as `runtime.subserver.main` does."""
        return subserver.main, spec

    def _spawn(self, i: int, started: Callable[[Any], None]) -> None:
        """Start subserver i and hand its process to `started` before a Ctrl-C can interrupt (`runtime.spawn`), so
        `stop()` always finds it. Its parent-death signal is tied to the calling thread (main, or the watcher)."""
        mc = self.config.models[i]
        spec = SubserverSpec(
            i, self.config, self.addresses, self.device, self.memory_gb, self.seed, dict(self.engine_overrides),
            self.stats_interval_s, str(self.hop_log(i)) if self.record_hops else None,
            str(self.step_log(i)) if self.step_logs else None,
            log_level=logging.getLogger("tokenrouter").getEffectiveLevel(),
            run_dir=str(self.run_dir) if self._own_dir else None,
        )  # fmt: skip
        if self.cluster is not None:
            spec = self.cluster.prepare(i, spec)
            remote = self.cluster.start_remote(i, spec)
            if remote is not None:
                started(remote)
                return
        env = dict(self._env_common)
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in mc.gpus)
            if mc.mps_active_thread_percentage is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mc.mps_active_thread_percentage)
        target, arg = self.subserver_target(spec)
        start_spawned(target, (arg,), name=f"tokenrouter-sub{i}", env=env, started=started)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while len(self.ready) < self.num_models:
            self.poll_control(100)
            for i, p in enumerate(self.processes):
                why = self.dead.get(i)
                if why is None and p.exitcode is not None and i not in self.ready:
                    self.poll_control(200)  # its Failed may still be in flight
                    why = self.dead.get(i, getattr(p, "exit_reason", None) or f"process exited with code {p.exitcode}")
                if why is not None:
                    raise StartupError(f"subserver {i} ({self.config.models[i].name}) failed during start-up: {why}")
            for name, p, _ in self.aux:
                if p.exitcode is not None:
                    raise StartupError(f"{name} failed during start-up ({describe_exit(p.exitcode)})")
            if time.monotonic() > deadline:
                missing = [self.config.models[i].name for i in range(self.num_models) if i not in self.ready]
                raise StartupError(f"no Ready within {self.ready_timeout_s:.0f} s from {', '.join(missing)}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shutdown to every process, join, kill what is left, stop the rest, merge the hop trace. Idempotent."""
        if self._stopping.is_set():
            return
        with self._lock:  # no restart in progress from here on
            self._stopping.set()
        try:
            with self._lock:
                for addr in (*self.addresses.subservers, *(a for _, _, a in self.aux)):
                    if not Addresses.known(addr):
                        continue  # over tcp: a subserver that never joined (it is killed below)
                    send_once(self._ctx, addr, [P.CTL, P.encode(P.Shutdown())], linger_ms=500)
            for i, p in enumerate(self.processes):
                if i not in self.ready and p.exitcode is None:
                    p.kill()  # still starting (a Ctrl-C in start-up): nothing to drain, and no socket read yet
            deadline = time.monotonic() + timeout_s
            every = [*self.processes, *(p for _, p, _ in self.aux)]
            for p in every:
                p.join(max(0.0, deadline - time.monotonic()))
            for p in every:
                if p.exitcode is None:
                    p.kill()
                    p.join(5)
        finally:
            # Only now: a subserver started by the watcher gets its parent-death signal when that thread ends.
            self._watch_done.set()
            if self._watcher is not None:
                self._watcher.join(2)
            if self.coordinator is not None:
                self.coordinator.stop()
            if self.mps is not None:
                self.mps.stop()
            if self.cluster is not None:
                self.cluster.close()
            if self.record_hops:
                merge_hop_logs(self.hop_logs(), self.record_hops)
            self._pull.close()
            self._ctx.term()
            if self._own_dir and not (self.step_logs and self.step_log_dir == self.run_dir):
                shutil.rmtree(self.run_dir, ignore_errors=True)
            log.info("stopped: every subserver has exited")

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def install_signal_handlers() -> None:
        """SIGTERM behaves like Ctrl-C in the main thread, so `with Server(...)` / `finally: stop()` runs."""

        def _raise(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _raise)
