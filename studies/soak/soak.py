"""Soak test of `tokenrouter serve` on CPU (tiny pair): N clients stream completions for a fixed time, some of
them leaving mid-stream at random; the resident memory of every process of the server is sampled throughout.

Criteria (issue #14): every process's RSS flat after the first minute (growth < 5%), 0 KV pages left once the
clients stop, 0 errors other than the client aborts, and the server exits 0 on SIGTERM.

    python studies/soak/soak.py --minutes 10 --clients 32 --abort-prob 0.1

Writes `results/soak-<UTC date>.json` (command, date, commit, summary, criteria) and `.csv` (RSS samples).
Not part of CI: it keeps both CPU cores busy for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from tokenrouter.bench.server import scrape as metrics
from tokenrouter.bench.server import spawn
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig, SchedulerConfig

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cfg_path: Path, port: int, log: Path, kv_tokens: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "serve", "--config", str(cfg_path), "--device", "cpu",
           "--port", str(port), "--kv-tokens", str(kv_tokens), "--no-access-log"]  # fmt: skip
    return spawn(cmd, log, {"OMP_NUM_THREADS": "1"})


class Tally:
    def __init__(self) -> None:
        self.complete = self.aborted = self.errors = self.tokens = 0
        self.error_samples: list[str] = []


async def client_loop(k: int, url: str, until: float, abort_prob: float, tally: Tally, rng: random.Random) -> None:
    async with httpx.AsyncClient(timeout=300) as c:
        model = (await c.get(url + "/v1/models")).json()["data"][0]["id"]
        while time.monotonic() < until:
            n_prompt, n_out = rng.randint(4, 40), rng.randint(8, 64)
            prompt = [rng.randint(1, 900) for _ in range(n_prompt)]
            leave = rng.randint(1, 6) if rng.random() < abort_prob else None
            body = {"model": model, "prompt": prompt, "max_tokens": n_out, "stream": True, "ignore_eos": True,
                    "temperature": rng.choice([0.0, 0.8])}  # fmt: skip
            got, done, err, chunks = 0, False, None, 0
            try:
                async with c.stream("POST", url + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    else:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: "):
                                continue
                            if line == "data: [DONE]":
                                done = True
                                continue
                            chunk = json.loads(line[6:])
                            if "error" in chunk:
                                err = chunk["error"]["message"]
                                continue
                            got += len((chunk.get("tokenrouter") or {}).get("models", []))
                            chunks += 1
                            if leave is not None and chunks >= leave:
                                break
            except httpx.HTTPError as e:
                err = f"{type(e).__name__}: {e}"
            tally.tokens += got
            if leave is not None and not done and err is None:
                tally.aborted += 1
            elif err is None and done and got == n_out:
                tally.complete += 1
            else:
                tally.errors += 1
                if len(tally.error_samples) < 10:
                    tally.error_samples.append(err or f"incomplete: {got}/{n_out} done={done}")


def rss_of(root: psutil.Process) -> dict[str, int]:
    """RSS per process of the server's tree, keyed by a stable role name."""
    out = {}
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            role = ("serve" if p.pid == root.pid else "resource_tracker" if "resource_tracker" in cmd
                    else f"subserver-pid{p.pid}")  # fmt: skip
            out[role] = p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out


async def sampler(root: psutil.Process, url: str, t0: float, until: float, every_s: float, rows: list,
                  tally: Tally) -> None:  # fmt: skip
    while True:
        t = time.monotonic() - t0
        row = {"t_s": round(t, 1), **rss_of(root), "requests_done": tally.complete + tally.aborted + tally.errors}
        try:
            m = await asyncio.to_thread(metrics, url)
            row["kv_pages_used"] = sum(v for k, v in m.items() if k.startswith("tokenrouter_kv_pages_used{"))
        except httpx.HTTPError:
            pass
        rows.append(row)
        if time.monotonic() >= until:
            return
        await asyncio.sleep(every_s)


def growth(rows: list[dict], key: str, baseline_s: float) -> dict[str, float] | None:
    """RSS growth of one process: the mean of the samples in [baseline_s, baseline_s + 30 s) against the mean of
    the last three samples, and the largest sample after the baseline."""
    base = [r[key] for r in rows if key in r and baseline_s <= r["t_s"] < baseline_s + 30]
    after = [r[key] for r in rows if key in r and r["t_s"] >= baseline_s]
    if not base or len(after) < 3:
        return None
    b = statistics.mean(base)
    return {"baseline_mb": b / 1e6, "final_mb": statistics.mean(after[-3:]) / 1e6,
            "max_mb": max(after) / 1e6, "growth_final": statistics.mean(after[-3:]) / b - 1,
            "growth_max": max(after) / b - 1}  # fmt: skip


async def drive(args, url: str, root: psutil.Process) -> tuple[Tally, list[dict], float]:
    tally, rows = Tally(), []
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    rng = random.Random(args.seed)
    clients = [client_loop(k, url, until, args.abort_prob, tally, random.Random(rng.random())) for k in
               range(args.clients)]  # fmt: skip
    await asyncio.gather(sampler(root, url, t0, until, args.sample_s, rows, tally), *clients)
    return tally, rows, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--abort-prob", type=float, default=0.1)
    ap.add_argument("--kv-tokens", type=int, default=4096)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    started = dt.datetime.now(dt.UTC)
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
                           policy=PolicyConfig(kind="eager"), router=RouterConfig("r2r", hop_rate=0.3),
                           scheduler=SchedulerConfig(max_batch_size=32, kv_growth_tokens=32))  # fmt: skip
    cfg_path = tmp / "serve.yaml"
    cfg.save(cfg_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "serve.log"
    proc = start_server(cfg_path, port, log, args.kv_tokens)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server not healthy in 300 s")
            time.sleep(0.5)
        root = psutil.Process(proc.pid)
        before = metrics(url)
        tally, rows, ran_s = asyncio.run(drive(args, url, root))
        t_idle = time.monotonic()
        pages = None
        while time.monotonic() - t_idle < 30:
            m = metrics(url)
            pages = sum(v for k, v in m.items() if k.startswith("tokenrouter_kv_pages_used{"))
            if pages == 0:
                break
            time.sleep(0.5)
        after = metrics(url)
        outcome = {k.split('outcome="')[1].split('"')[0]: after[k] - before.get(k, 0.0) for k in after
                   if k.startswith("tokenrouter_http_requests_total{")}  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    server_log = log.read_text()
    keys = sorted({k for r in rows for k in r if k not in ("t_s", "requests_done", "kv_pages_used")})
    mem = {k: growth(rows, k, 60.0) for k in keys}
    criteria = {
        "rss_growth_below_5pct_after_first_minute": all(
            g is not None and g["growth_final"] < 0.05 for g in mem.values()
        ),
        "zero_kv_pages_left": pages == 0,
        "zero_errors_besides_aborts": tally.errors == 0 and outcome.get("error", 0) == 0,
        "exit_0_on_sigterm": code == 0,
        "no_traceback_in_log": "Traceback" not in server_log,
    }
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()  # fmt: skip
    result = {
        "command": " ".join(["python", "studies/soak/soak.py", *sys.argv[1:]]),
        "date_utc": started.isoformat(timespec="seconds"),
        "commit": commit,
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "config": {
            "models": ["tiny-small", "tiny-large"],
            "policy": "eager",
            "router": "r2r 0.3",
            "kv_tokens": args.kv_tokens,
            "clients": args.clients,
            "minutes": args.minutes,
            "abort_prob": args.abort_prob,
            "prompt_tokens": "4-40",
            "max_tokens": "8-64",
        },
        "ran_s": round(ran_s, 1),
        "requests": {
            "complete": tally.complete,
            "aborted_by_client": tally.aborted,
            "errors": tally.errors,
            "error_samples": tally.error_samples,
            "tokens_received": tally.tokens,
        },
        "server_outcome_counts": outcome,
        "kv_pages_left": pages,
        "exit_code": code,
        "rss": mem,
        "criteria": criteria,
        "passed": all(criteria.values()),
    }
    (args.out / f"soak-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    with (args.out / f"soak-{stamp}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t_s", "requests_done", "kv_pages_used", *keys])
        w.writeheader()
        w.writerows(rows)
    print(json.dumps({k: result[k] for k in ("requests", "server_outcome_counts", "kv_pages_left", "exit_code",
                                             "criteria", "passed")}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
