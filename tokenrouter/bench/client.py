"""The bench's HTTP side: closed-loop workers or Poisson arrivals streaming `/v1/completions` with token-id prompts
and `ignore_eos`. Every SSE chunk is timed on arrival and its tokens credited to the model the server names per
token, so the latencies follow bench_serving's definitions (`tokenrouter.metrics`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby

import httpx

from tokenrouter.bench.scrape import ServerSamples
from tokenrouter.metrics import MetricsCollector
from tokenrouter.workloads import Phase, RequestSpec, request_ids, request_seed


@dataclass(slots=True)
class BenchOutcome:
    metrics: MetricsCollector
    samples: ServerSamples
    model_names: list[str]
    served_model: str
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    phases: list[tuple[float, Phase]] = field(default_factory=list)  # (bench time s, phase) as applied
    exhausted_at: float | None = None  # closed loop: (0, this] is the steady window, as `sim.clients.ClosedLoop`'s
    requests_sent: int = 0
    unreachable: str | None = None  # why the server did not answer at the end; None: it did
    interrupted: bool = False  # Ctrl-C: nothing more was sent; the requests in flight were cancelled
    requests_cancelled: int = 0


async def _model_info(client: httpx.AsyncClient) -> tuple[str, list[str]]:
    r = await client.get("/v1/models")
    r.raise_for_status()
    card = r.json()["data"][0]
    return card["id"], list((card.get("tokenrouter") or {}).get("models") or [card["id"]])


async def run_bench(url: str, specs: list[RequestSpec], *, concurrency: int | None, arrival_rate: float | None,
                    seed: int = 0, api_key: str | None = None, on_done: Callable[[], None] | None = None,
                    scrape_every_s: float = 0.25, timeout_s: float = 600.0, phases: list[Phase] | None = None,
                    admin_key: str | None = None, duration_s: float | None = None) -> BenchOutcome:  # fmt: skip
    """Run `specs` against `url`, moving through `phases` (worker count, hop rate via POST /admin/policy with
    `admin_key`); after `duration_s` nothing more is sent (those running finish)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    phases = list(phases or [])
    limits = httpx.Limits(max_connections=max(concurrency or 0, 64))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:
        served, names = await _model_info(client)
        out = BenchOutcome(MetricsCollector(len(names)), ServerSamples(), names, served)
        run = _BenchRun(client, out, seed=seed, on_done=on_done, scrape_every_s=scrape_every_s, admin_key=admin_key)
        scrape_task = asyncio.create_task(run.scrape())
        try:
            await run.send(specs, phases, concurrency, arrival_rate, duration_s)
        finally:
            scrape_task.cancel()
            try:
                out.samples.add(run.now(), (await client.get("/metrics")).text)
            except httpx.HTTPError as e:  # the server went away: what was measured until then is kept
                out.unreachable = f"{type(e).__name__}: {e}"
        out.wall_s = run.now()
        return out


class _BenchRun:
    """One `run_bench` call's shared state; time 0 is when the first request could go out."""

    def __init__(self, client: httpx.AsyncClient, out: BenchOutcome, *, seed: int,
                 on_done: Callable[[], None] | None, scrape_every_s: float, admin_key: str | None) -> None:  # fmt: skip
        self.client, self.out, self.seed, self.on_done = client, out, seed, on_done
        self.scrape_every_s, self.admin_key = scrape_every_s, admin_key
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def send(self, specs: list[RequestSpec], phases: list[Phase], concurrency: int | None,
                   arrival_rate: float | None, duration_s: float | None) -> None:  # fmt: skip
        """Send every request, open or closed loop, moving through `phases` on the way."""
        out = self.out
        open_loop = arrival_rate is not None or any(s.arrival is not None for s in specs)
        if phases and phases[0].at_s == 0:
            await self.apply(phases[0], None)  # before any request: the starting point
        start_n = phases[0].concurrency if phases and phases[0].at_s == 0 and phases[0].concurrency else None
        loop = None if open_loop else _Workers(specs, self.one, start_n or concurrency or 1, self.now, duration_s)
        drive = asyncio.create_task(self.drive(phases, loop))
        try:
            await (_open_loop(specs, self.one, self.now, duration_s) if loop is None else loop.run())
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task; what was measured is kept
            _interrupted(out, loop, self.now())
        finally:
            drive.cancel()
        if loop is not None and out.exhausted_at is None:
            out.exhausted_at = loop.exhausted_at

    async def one(self, spec: RequestSpec) -> None:
        out = self.out
        out.requests_sent += 1
        try:
            await _stream_one(self.client, spec, self.seed, out.served_model, out.metrics, self.now)
        except asyncio.CancelledError:  # Ctrl-C: not done, not failed
            out.requests_cancelled += 1
            raise
        except Exception as e:  # one failed request is reported, the run goes on
            out.errors.append(f"{spec.rid}: {type(e).__name__}: {e}")
        if self.on_done is not None:
            self.on_done()

    async def scrape(self) -> None:
        while True:
            try:
                r = await self.client.get("/metrics")
                self.out.samples.add(self.now(), r.text)
            except httpx.HTTPError:
                pass
            await asyncio.sleep(self.scrape_every_s)

    async def set_hop_rate(self, rate: float) -> None:
        r = await self.client.post("/admin/policy", json={"hop_rate": rate},
                                   headers={"Authorization": f"Bearer {self.admin_key}"})  # fmt: skip
        if r.status_code != 200:
            why = f"HTTP {r.status_code}: {r.text[:200]}"
            raise RuntimeError(f"hop rate {rate} refused by the admin endpoint: {why}")

    async def apply(self, ph: Phase, loop: _Workers | None) -> None:
        if ph.hop_rate is not None:
            await self.set_hop_rate(ph.hop_rate)
        if ph.concurrency is not None and loop is not None:
            loop.set_concurrency(ph.concurrency)
        self.out.phases.append((self.now(), ph))

    async def drive(self, phases: list[Phase], loop: _Workers | None) -> None:
        """The phases after time 0, each at its time; one the server refuses is reported and the run goes on."""
        for ph in (p for p in phases if p.at_s > 0):
            await asyncio.sleep(max(0.0, ph.at_s - self.now()))
            try:
                await self.apply(ph, loop)
            except (RuntimeError, httpx.HTTPError) as e:
                self.out.errors.append(f"phase at {ph.at_s:g} s: {e}")


def _interrupted(out: BenchOutcome, loop: _Workers | None, t: float) -> None:
    """The run was cancelled at `t`: mark it, end the closed loop's steady window there, and take the cancel back so
    the last /metrics poll can still await."""
    out.interrupted = True
    if loop is not None:
        out.exhausted_at = loop.exhausted_at if loop.exhausted_at is not None else t
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class _Workers:
    """Closed loop: workers share one request iterator; with fewer, workers retire as their current request ends."""

    def __init__(self, specs: list[RequestSpec], one, concurrency: int, now: Callable[[], float],
                 duration_s: float | None = None) -> None:  # fmt: skip
        self.it, self.one, self.target, self.now, self.duration_s = iter(specs), one, concurrency, now, duration_s
        self.workers = 0
        self.tasks: list[asyncio.Task] = []
        self.exhausted = False
        self.exhausted_at: float | None = None

    def set_concurrency(self, n: int) -> None:
        self.target = n
        self._start(n - self.workers)

    def _start(self, k: int) -> None:
        for _ in range(max(0, k) if not self.exhausted else 0):
            self.workers += 1
            self.tasks.append(asyncio.create_task(self._worker()))

    async def _worker(self) -> None:
        try:
            while True:
                # Out of time counts as out of requests: from then on fewer than N are live (the steady window ends).
                spec = None if self.duration_s is not None and self.now() >= self.duration_s else next(self.it, None)
                if spec is None:
                    break
                await self.one(spec)
                if self.workers > self.target:
                    return
            if not self.exhausted:
                self.exhausted_at = self.now()
            self.exhausted = True
        finally:
            self.workers -= 1

    async def run(self) -> None:
        self._start(self.target)
        try:
            while pending := [t for t in self.tasks if not t.done()]:
                await asyncio.wait(pending)
        except asyncio.CancelledError:
            await _cancel(self.tasks)
            raise


async def _open_loop(specs: list[RequestSpec], one, now, duration_s: float | None = None) -> None:
    tasks = []
    try:
        for spec in sorted(specs, key=lambda s: s.arrival or 0.0):
            if duration_s is not None and (spec.arrival or 0.0) >= duration_s:
                break
            wait = (spec.arrival or 0.0) - now()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(spec)))
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        await _cancel(tasks)
        raise


async def _cancel(tasks: list[asyncio.Task]) -> None:
    """Cancel `tasks` and wait until each has ended (each cancelled request counts itself in `one`)."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _stream_one(client: httpx.AsyncClient, spec, seed: int, served, metrics: MetricsCollector, now) -> None:
    ids = request_ids(spec, seed)
    body = {"model": served, "prompt": ids, "max_tokens": spec.output_len, "temperature": 0.0, "ignore_eos": True,
            "seed": request_seed(spec, seed), "stream": True}  # fmt: skip
    metrics.on_arrival(spec.rid, now(), len(ids))
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", "error chunk"))
            t = now()
            ext = chunk.get("tokenrouter") or {}
            for model, run in groupby(ext.get("models") or []):
                metrics.on_tokens(spec.rid, len(list(run)), t, model)
            if chunk["choices"][0].get("finish_reason") is not None:
                metrics.on_finish(spec.rid, t, int(ext.get("hops", 0)))
