"""A real `tokenrouter serve` (the CLI a user runs) on the tiny CPU pair, in its own process group, and small
HTTP helpers for the end-to-end tests: streamed completions, /metrics scraping, process-tree bookkeeping."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from tokenrouter.bench.server import spawn
from tokenrouter.core.config import (
    AutotuneConfig,
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    RouterConfig,
    SchedulerConfig,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, router: str, *, weights: str | None = None, hop_rate: float = 0.4,
                 models: tuple[str, ...] = ("tiny-small", "tiny-large"), policy: str = "eager") -> Path:  # fmt: skip
    cfg = DeploymentConfig(
        models=[ModelConfig(m) for m in models],
        policy=PolicyConfig(kind=policy),
        router=RouterConfig(router, hop_rate=hop_rate, return_prob=0.5, weights=weights),
        scheduler=SchedulerConfig(max_batch_size=32, kv_growth_tokens=32),
    )
    path.write_text(cfg.to_yaml())
    yaml.safe_load(path.read_text())  # what tr serve reads back
    return path


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    log: Path

    @classmethod
    def start(cls, tmp: Path, config: Path, *, kv_tokens: int = 2048, timeout_s: float = 180.0,
              extra: tuple[str, ...] = (), device: str = "cpu") -> Served:  # fmt: skip
        port = free_port()
        log = tmp / f"serve-{port}.log"
        cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "serve", "--config", str(config), "--device", device,
               "--port", str(port), "--kv-tokens", str(kv_tokens), *extra]  # fmt: skip
        proc = spawn(cmd, log, {"OMP_NUM_THREADS": "1"})
        srv = cls(proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tr serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(srv.url + "/health", timeout=2).status_code == 200:
                    return srv
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                srv.kill()
                raise RuntimeError(f"tr serve not healthy in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)

    def tree(self) -> list[psutil.Process]:
        """The server process and every descendant (subservers, the MPS daemon if any)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def subserver_pids(self) -> list[int]:
        """Model i's process id, from the latest "model i (...): ready ... pid N" line of the log (children in
        start order would include multiprocessing's resource tracker, and a restarted subserver comes last)."""
        pids: dict[int, int] = {}
        for m in re.finditer(r"model (\d+) \([^)]*\): ready in .*pid (\d+)\)", self.log.read_text()):
            pids[int(m.group(1))] = int(m.group(2))
        return [pids[i] for i in sorted(pids)]

    def run_dir(self) -> Path:
        """The server's run directory, as its start-up log line names it."""
        m = re.search(r"run directory (\S+)", self.log.read_text())
        assert m, "no run directory in the log"
        return Path(m.group(1))

    def kill(self) -> None:
        with_children = self.tree()
        for p in with_children:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(with_children, timeout=10)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                key, _, val = line.rpartition(" ")
                out[key] = float(val)
        return out

    def kv_pages_used(self) -> list[float]:
        m = self.metrics()
        return [v for k, v in m.items() if k.startswith("tokenrouter_kv_pages_used{")]


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    models: list[int] = field(default_factory=list)  # writer of each token, in order
    text: str = ""
    finish_reason: str | None = None
    usage: dict = field(default_factory=dict)
    tokenrouter: dict = field(default_factory=dict)
    error: str | None = None
    done: bool = False


async def stream_completion(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int,
                            **extra) -> Stream:  # fmt: skip
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0, **extra}
    models = (await client.get(url + "/v1/models")).json()["data"]
    body["model"] = models[0]["id"]
    out = Stream()
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            out.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}"
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out.done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                out.error = str(chunk["error"])
                continue
            tr = chunk.get("tokenrouter") or {}
            out.models.extend(tr.get("models", []))
            for ch in chunk.get("choices", []):
                out.text += ch.get("text") or ""
                out.finish_reason = ch.get("finish_reason") or out.finish_reason
            if chunk.get("usage"):
                out.usage, out.tokenrouter = chunk["usage"], tr
    return out


def terminate(srv: Served, timeout_s: float = 20.0) -> float:
    """SIGTERM the server; seconds until it and every descendant are gone (raises if not within timeout)."""
    procs = srv.tree()
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(timeout=timeout_s)
    _, alive = psutil.wait_procs(procs, timeout=max(0.1, timeout_s - (time.monotonic() - t0)))
    if alive:
        raise AssertionError(f"still running {timeout_s} s after SIGTERM: {[p.pid for p in alive]}")
    return time.monotonic() - t0


def fast_autotune_config(path: Path) -> Path:
    """The tiny pair, delayed (1,5) at hop 0.3 with autotune observing every 0.5 s and re-solving every 1.5 s, so a
    CPU load moves B within seconds. verify_s 0: a change is what the runtime tests follow (a revert takes the same
    path); the trial and its revert are tested in tests/core and tests/sim, where rates do not depend on a shared
    CPU."""
    tune = AutotuneConfig(observe_s=0.5, interval_s=1.5, hold_s=1.0, half_life_s=3.0, step_half_life_s=30.0,
                          min_steps=20, max_states=20_000, verify_s=0.0)  # fmt: skip
    cfg = DeploymentConfig(
        models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
        policy=PolicyConfig("delayed", [1, 5], autotune=tune),
        router=RouterConfig("r2r", hop_rate=0.3),
        scheduler=SchedulerConfig(max_batch_size=32, kv_growth_tokens=32),
    )
    path.write_text(cfg.to_yaml())
    return path
