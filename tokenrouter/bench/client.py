"""The bench's HTTP side: closed-loop workers or Poisson arrivals sending streaming `/v1/completions` with
token-id prompts (so prompt lengths are exact) and `ignore_eos` (so output lengths are the workload's).

Every SSE chunk is timed on arrival and its tokens are credited to the model the server names per token
(the `tokenrouter.models` extension), so TTFT/ITL/TPOT/E2E follow bench_serving's definitions through
`tokenrouter.metrics.MetricsCollector`; the final chunk's `tokenrouter.hops` is the request's hop count.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from tokenrouter.bench.scrape import ServerSamples
from tokenrouter.metrics import MetricsCollector
from tokenrouter.workloads import RequestSpec


@dataclass(slots=True)
class BenchOutcome:
    metrics: MetricsCollector
    samples: ServerSamples
    model_names: list[str]
    served_model: str
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def prompt_ids(spec: RequestSpec, seed: int, vocab: int = 1000) -> list[int]:
    """The workload's ids, or `prompt_len` reproducible ids in [10, vocab) (every tokenizer has those)."""
    if spec.prompt_ids:
        return list(spec.prompt_ids)
    rng = np.random.default_rng([seed, zlib.crc32(spec.rid.encode())])
    return rng.integers(10, vocab, size=spec.prompt_len).tolist()


async def _model_info(client: httpx.AsyncClient) -> tuple[str, list[str]]:
    r = await client.get("/v1/models")
    r.raise_for_status()
    card = r.json()["data"][0]
    return card["id"], list((card.get("tokenrouter") or {}).get("models") or [card["id"]])


async def run_bench(
    url: str,
    specs: list[RequestSpec],
    *,
    concurrency: int | None,
    arrival_rate: float | None,
    seed: int = 0,
    api_key: str | None = None,
    on_done: Callable[[], None] | None = None,
    scrape_every_s: float = 0.25,
    timeout_s: float = 600.0,
) -> BenchOutcome:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrency or 0, 64))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:
        served, names = await _model_info(client)
        out = BenchOutcome(MetricsCollector(len(names)), ServerSamples(), names, served)
        t0 = time.perf_counter()
        now = lambda: time.perf_counter() - t0  # noqa: E731

        async def one(spec: RequestSpec) -> None:
            try:
                await _stream_one(client, spec, prompt_ids(spec, seed), served, out.metrics, now)
            except Exception as e:  # one failed request is reported, the run goes on
                out.errors.append(f"{spec.rid}: {type(e).__name__}: {e}")
            if on_done is not None:
                on_done()

        async def scraper() -> None:
            while True:
                try:
                    r = await client.get("/metrics")
                    out.samples.add(now(), r.text)
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(scrape_every_s)

        scrape_task = asyncio.create_task(scraper())
        try:
            if arrival_rate is not None or any(s.arrival is not None for s in specs):
                await _open_loop(specs, one, now)
            else:
                await _closed_loop(specs, one, concurrency or 1)
        finally:
            scrape_task.cancel()
            out.samples.add(now(), (await client.get("/metrics")).text)
        out.wall_s = now()
        return out


async def _closed_loop(specs: list[RequestSpec], one, concurrency: int) -> None:
    it = iter(specs)

    async def worker() -> None:
        for spec in it:
            await one(spec)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(specs: list[RequestSpec], one, now) -> None:
    tasks = []
    for spec in sorted(specs, key=lambda s: s.arrival or 0.0):
        wait = (spec.arrival or 0.0) - now()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(spec)))
    await asyncio.gather(*tasks)


async def _stream_one(client: httpx.AsyncClient, spec, ids, served, metrics: MetricsCollector, now) -> None:
    body = {
        "model": served,
        "prompt": ids,
        "max_tokens": spec.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
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
            for model, n in _runs(ext.get("models") or []):
                metrics.on_tokens(spec.rid, n, t, model)
            if chunk["choices"][0].get("finish_reason") is not None:
                metrics.on_finish(spec.rid, t, int(ext.get("hops", 0)))


def _runs(models: list[int]) -> list[tuple[int, int]]:
    """[0, 0, 1, 0] -> [(0, 2), (1, 1), (0, 1)]."""
    out: list[tuple[int, int]] = []
    for m in models:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out
