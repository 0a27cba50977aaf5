"""Prometheus metrics of one front-end app, in a registry of its own (no process globals, so two apps in one
process, as in the tests, do not share or clash).

Per-model figures are read at scrape time from the last `Stats` heartbeat of each subserver (a custom
collector), so they are exactly what the subserver reported: gauges for KV pages and queues (a subserver sends
`Stats` within 50 ms of a change, not only on its heartbeat), counters for the cumulative tokens, hops, steps,
rows, step time and busy time, and the derived mean batch size and step time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenrouter.runtime.frontend.backend import Backend

_GAUGES = (
    ("kv_pages_used", "KV pages in use", "kv_pages_used"),
    ("kv_pages_total", "KV pages in the pool", "kv_pages_total"),
    ("requests_running", "requests in the running batch", "running"),
    ("requests_waiting", "requests queued, ready but not running (queue length)", "waiting"),
    ("requests_pending", "requests parked while another model holds them", "pending"),
    ("prefix_cached_pages", "KV pages held by the prefix cache (std-serving baseline)", "prefix_cached_pages"),
)
_COUNTERS = (
    ("tokens", "output tokens committed by the model", "tokens"),
    ("hops", "hand-offs sent by the model", "hops"),
    ("steps", "engine steps run", "steps"),
    ("step_rows", "rows over all steps", "step_rows"),
    ("loop_steps", "steps launched back to back (the loop had work since the previous completion)", "loop_steps"),
    ("loop_rows", "rows over the back-to-back steps", "loop_rows"),
    ("prefix_requests", "requests the prefix cache matched (std-serving baseline: one per hop)", "prefix_requests"),
    ("prefix_hits", "requests that matched at least one cached page", "prefix_hits"),
    ("prefix_prompt_tokens", "tokens of the requests the prefix cache matched", "prefix_prompt_tokens"),
    ("prefix_matched_tokens", "of those, tokens found cached (the rest were computed again)", "prefix_matched_tokens"),
    ("prefix_evicted_pages", "KV pages evicted from the prefix cache", "prefix_evicted_pages"),
)
_SECONDS = (
    ("step_seconds", "time spent in engine steps, summed per step (overlapped steps count twice)", "step_ms"),
    ("busy_seconds", "time with at least one step in flight (the union of the steps' intervals)", "busy_ms"),
    ("loop_seconds", "completion-to-completion time of the back-to-back steps (the serving loop's period)", "loop_ms"),
    ("loop_gpu_seconds", "GPU time of the back-to-back steps (CUDA events; 0 on CPU)", "loop_gpu_ms"),
    ("prefix_host_seconds", "host time in the prefix cache: match, insert, eviction", "prefix_host_ms"),
)


class StatsCollector(Collector):
    """Turns each model's latest `Stats` into metric families labelled with the model name."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("tokenrouter_subserver_up", "1 while the subserver is alive and ready", labels=["model"])
        gauges = {k: GaugeMetricFamily(f"tokenrouter_{k}", h, labels=["model"]) for k, h, _ in _GAUGES}
        counters = {k: CounterMetricFamily(f"tokenrouter_{k}", h, labels=["model"]) for k, h, _ in _COUNTERS}
        seconds = {k: CounterMetricFamily(f"tokenrouter_{k}", h, labels=["model"]) for k, h, _ in _SECONDS}
        batch = GaugeMetricFamily("tokenrouter_batch_size_mean", "mean rows per step since start", labels=["model"])
        step_ms = GaugeMetricFamily("tokenrouter_step_time_ms_mean", "mean step time since start", labels=["model"])
        for m in self.backend.models:
            up.add_metric([m.name], 1.0 if m.ready and not m.dead else 0.0)
            s = m.stats
            if s is None:
                continue
            for k, _, attr in _GAUGES:
                gauges[k].add_metric([m.name], float(getattr(s, attr)))
            for k, _, attr in _COUNTERS:
                counters[k].add_metric([m.name], float(getattr(s, attr)))
            for k, _, attr in _SECONDS:
                seconds[k].add_metric([m.name], getattr(s, attr) / 1e3)
            batch.add_metric([m.name], s.step_rows / s.steps if s.steps else 0.0)
            step_ms.add_metric([m.name], s.step_ms / s.steps if s.steps else 0.0)
        yield up
        yield from gauges.values()
        yield from counters.values()
        yield from seconds.values()
        yield from (batch, step_ms)


class FrontendMetrics:
    """The app's registry plus the front-end's own request counters."""

    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StatsCollector(backend))
        self.requests = Counter(
            "tokenrouter_http_requests",
            "generation requests answered, by outcome: ok, error (4xx/5xx or an error mid-stream), aborted (the "
            "client went away first)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("ok", "error", "aborted"):
            self.requests.labels(outcome)
        self.in_flight = Gauge(
            "tokenrouter_http_requests_in_flight", "generation requests being answered", registry=self.registry
        )
