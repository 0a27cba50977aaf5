"""What `tr serve` checks before any weight loads; each check raises `PreflightError` with one line saying what to
change, so a mistake costs a second instead of a model load."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from tokenrouter.core.config import DeploymentConfig

# Dummy and loaded weights are float32 on CPU (`engine.config`: dtype "auto").
CPU_WEIGHT_BYTES_PER_PARAM = 4


class PreflightError(ValueError):
    """A deployment that cannot start here; the message is one line."""


def check_launch(cfg: DeploymentConfig | None, device: str, restart_on_failure: bool = False) -> None:
    """A device other than cpu or cuda, or restart-on-failure under a sync policy (`cfg` None: the device alone)."""
    if device not in ("cpu", "cuda"):
        raise PreflightError(f"device must be cpu or cuda, got {device!r}")
    if cfg is not None and restart_on_failure and cfg.policy.is_sync:
        raise PreflightError(f"restart on failure needs an asynchronous policy (eager, delayed), not "
                             f"{cfg.policy.kind}: the sync coordinator cannot take a subserver back in the middle "
                             "of a round")  # fmt: skip


def check_files(cfg: DeploymentConfig) -> None:
    """Every file the deployment names exists: weights directories, the router checkpoint, a hop trace."""
    named = [(f"model {m.name}: weights directory", m.path) for m in cfg.models if m.path is not None]
    if cfg.router.weights is not None and cfg.router.weights.lower() != "random":
        named.append(("--router-model: router checkpoint", cfg.router.weights))
    if cfg.router.trace is not None:
        named.append(("router trace", cfg.router.trace))
    for what, path in named:
        if not Path(path).exists():
            raise PreflightError(f"{what} {path} not found")


def check_port(host: str, port: int) -> None:
    """`port` is a TCP port number and nothing listens on it at `host` (a test bind, released at once)."""
    if not 1 <= port <= 65535:
        raise PreflightError(f"--port must be in 1..65535, got {port}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise PreflightError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT does not count
        try:
            s.bind(addr)
        except OSError as e:
            raise PreflightError(f"--port {port}: cannot bind {host}:{port} ({e.strerror}); is a server already "
                                 "running there? pick another --port") from None  # fmt: skip


def check_cuda(cfg: DeploymentConfig) -> None:
    """nvidia-smi lists every GPU the deployment uses (the launcher never starts CUDA: it would be an MPS client)."""
    hint = "; on a machine without a GPU, serve with --device cpu"
    if shutil.which("nvidia-smi") is None:
        raise PreflightError(f"no CUDA device found (nvidia-smi is not on PATH){hint}")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise PreflightError(f"no CUDA device found (nvidia-smi -L failed: {e}){hint}") from None
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    wanted = sorted({g for m in cfg.models for g in m.gpus})
    if count == 0 or wanted[-1] >= count:
        raise PreflightError(f"GPUs {wanted} asked for, {count} CUDA device(s) found{hint if count == 0 else ''}")


def available_memory_bytes() -> int | None:
    """The host's available memory (MemAvailable in /proc/meminfo); None where that file does not exist."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def check_cpu_memory(cfg: DeploymentConfig, available: int | None = None) -> None:
    """On CPU the models' float32 weights and KV caches fit in the host's available memory."""
    from tokenrouter.models import load_spec

    available = available_memory_bytes() if available is None else available
    if available is None:
        return
    need = sum(
        load_spec(m.path or m.name).num_params * CPU_WEIGHT_BYTES_PER_PARAM + (m.kv_budget_gb or 0.0) * 1e9
        for m in cfg.models
    )
    if need > available:
        names = " + ".join(m.name for m in cfg.models)
        raise PreflightError(f"{names} need {need / 1e9:.1f} GB on CPU (float32 weights and KV cache); "
                             f"{available / 1e9:.1f} GB of host memory is available")  # fmt: skip


def preflight(cfg: DeploymentConfig, *, device: str, host: str, port: int, local: bool = True) -> None:
    """Every check above that applies, and `max_model_len` within every model's context; `local` False (subservers
    elsewhere): only the port."""
    from tokenrouter.deploy.builder import max_context_len

    check_port(host, port)
    if not local or any(m.host is not None or m.external for m in cfg.models):
        return
    check_files(cfg)
    try:
        max_context_len(cfg)
    except ValueError as e:
        raise PreflightError(str(e)) from None
    if device == "cuda":
        check_cuda(cfg)
    else:
        check_cpu_memory(cfg)
