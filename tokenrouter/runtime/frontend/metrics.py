"""Prometheus metrics of one front-end app, in a registry of its own (two apps in one process never clash);
per-model figures are each subserver's last `Stats`, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenrouter.core.config import PolicyConfig
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
        counters = {k: CounterMetricFamily(f"tokenrouter_{k}", h, labels=["model"]) for k, h, _ in _COUNTERS + _SECONDS}
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
                counters[k].add_metric([m.name], getattr(s, attr) / 1e3)
            batch.add_metric([m.name], s.step_rows / s.steps if s.steps else 0.0)
            step_ms.add_metric([m.name], s.step_ms / s.steps if s.steps else 0.0)
        yield up
        yield from gauges.values()
        yield from counters.values()
        yield from (batch, step_ms)


def nominal_thresholds(pc: PolicyConfig, live: int, num_models: int) -> tuple[int, ...] | None:
    """B as configured for live N, before the deadlock guard's clamp (which would make a steady B look like it
    flaps); None when it does not fit the models."""
    try:
        return pc.build().nominal_thresholds(max(1, live), num_models)
    except ValueError:
        return None


class PolicyCollector(Collector):
    """The thresholds B in force and, with autotune, its counters and latest estimates."""

    def __init__(self, backend: Backend, state: Any, autotune: Any = None) -> None:
        self.backend, self.state, self.autotune = backend, state, autotune

    def collect(self) -> Iterator[Metric]:
        names = [m.name for m in self.backend.models]
        pc = self.state.policy
        if pc is not None:
            entry = self.backend.handle.entry
            stats = self.backend.models[entry].stats
            b = nominal_thresholds(pc, stats.live if stats is not None else 1, len(names))
            if b is not None:
                g = GaugeMetricFamily("tokenrouter_policy_threshold", "delayed-batching threshold B in force (the "
                                      "table's row for the live N; 1: eager; subservers clamp it for the deadlock "
                                      "guard when N is lower)", labels=["model"])  # fmt: skip
                for name, x in zip(names, b, strict=True):
                    g.add_metric([name], float(x))
                yield g
        if self.autotune is None:
            return
        c = self.autotune.controller
        yield GaugeMetricFamily("tokenrouter_autotune_paused", "1 while autotune is paused (POST /admin/policy "
                                "{\"autotune\": false}), else 0", value=float(self.autotune.paused))  # fmt: skip
        yield CounterMetricFamily("tokenrouter_autotune_changes", "B changes autotune applied", value=c.changes)
        yield CounterMetricFamily("tokenrouter_autotune_solves", "solves autotune ran (simulator decisions)",
                                  value=c.solves)  # fmt: skip
        yield CounterMetricFamily("tokenrouter_autotune_reverts", "B changes autotune undid because the new B "
                                  "measured slower (counted in changes too)", value=c.reverts)  # fmt: skip
        if self.autotune.last_gain is not None:
            yield GaugeMetricFamily("tokenrouter_autotune_predicted_gain", "predicted relative throughput gain of "
                                    "the last B change", value=self.autotune.last_gain)  # fmt: skip
        est = c.estimates
        if est is None:
            return
        yield GaugeMetricFamily("tokenrouter_autotune_concurrency", "live N autotune solves for", value=est.concurrency)
        if est.mean_output is not None:
            yield GaugeMetricFamily("tokenrouter_autotune_mean_output", "estimated mean output tokens per request",
                                    value=est.mean_output)  # fmt: skip
        hop = GaugeMetricFamily("tokenrouter_autotune_hop_prob", "estimated probability that a routed token hands "
                                "the request off", labels=["model"])  # fmt: skip
        a = GaugeMetricFamily("tokenrouter_autotune_step_ms_intercept", "estimated step time a in L(b) = a + c b (ms)",
                              labels=["model"])  # fmt: skip
        per = GaugeMetricFamily("tokenrouter_autotune_step_ms_per_row", "estimated step time c in L(b) = a + c b (ms "
                                "per row)", labels=["model"])  # fmt: skip
        for name, p, line in zip(names, est.hop_prob, est.step, strict=True):
            if p is not None:
                hop.add_metric([name], p)
            if line is not None:
                a.add_metric([name], line.intercept_ms)
                per.add_metric([name], line.per_row_ms)
        yield from (hop, a, per)


class FrontendMetrics:
    """The app's registry plus the front-end's own request counters."""

    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StatsCollector(backend))
        self.requests = Counter("tokenrouter_http_requests", "generation requests answered, by outcome: ok, error "
                                "(4xx/5xx or an error mid-stream), aborted (the client went away first)", ["outcome"],
                                registry=self.registry)  # fmt: skip
        for outcome in ("ok", "error", "aborted"):
            self.requests.labels(outcome)
        self.in_flight = Gauge("tokenrouter_http_requests_in_flight", "generation requests being answered",
                               registry=self.registry)  # fmt: skip
