"""Run plots a person can read, shared by `trsim run --plot` and `tr bench --plot` (live and simulated
overlaid): per model, with model names, queue length and busy fraction as rolling means over time, the
batch-size histogram, output throughput over time, and TTFT / TPOT / E2E CDFs.

A run becomes a `RunSeries` first (from a simulator `MetricsCollector`, or from a bench outcome whose
per-model figures come from the server's polled counters), so the drawing code has one input whatever the
source. matplotlib's object API (no pyplot state), imported lazily.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenrouter.metrics import _busy_time, _time_weighted_mean

if TYPE_CHECKING:
    import pandas as pd

    from tokenrouter.metrics import MetricsCollector

__all__ = ["RunSeries", "plot_bench", "plot_run", "plot_series", "plot_sweep", "series_from_collector"]

BINS = 40


@dataclass(slots=True)
class ModelSeries:
    queue: tuple[np.ndarray, np.ndarray]  # (bin centre s, rolling mean waiting requests)
    busy: tuple[np.ndarray, np.ndarray]  # (bin centre s, busy fraction)
    batch_sizes: np.ndarray  # one value per step (or per polled interval for a live run)
    batch_weights: np.ndarray  # steps each value stands for


@dataclass(slots=True)
class RunSeries:
    label: str  # "sim" | "live"
    models: dict[str, ModelSeries] = field(default_factory=dict)
    throughput: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))  # (bin centre s, output tok/s)
    ttft: np.ndarray = field(default_factory=lambda: np.empty(0))  # seconds
    tpot: np.ndarray = field(default_factory=lambda: np.empty(0))
    e2e: np.ndarray = field(default_factory=lambda: np.empty(0))


def _edges(t_end: float) -> np.ndarray:
    return np.linspace(0.0, max(t_end, 1e-9), BINS + 1)


def _requests_part(rs: RunSeries, collector: MetricsCollector) -> float:
    done = collector.completed()
    rs.ttft = np.array([r.ttft for r in done], float)
    rs.e2e = np.array([r.e2e for r in done], float)
    rs.tpot = np.array([(r.e2e - r.ttft) / (r.output_len - 1) for r in done if r.output_len > 1], float)
    times = np.concatenate([np.asarray(r.token_times, float) for r in collector.records.values()] or [np.empty(0)])
    t_end = float(times.max()) if len(times) else 0.0
    edges = _edges(t_end)
    counts, _ = np.histogram(times, edges)
    rs.throughput = ((edges[:-1] + edges[1:]) / 2, counts / np.diff(edges))
    return t_end


def series_from_collector(collector: MetricsCollector, names: list[str], label: str = "sim") -> RunSeries:
    """Per-step traces binned into rolling means over `BINS` equal windows of the run."""
    rs = RunSeries(label)
    edges = _edges(_requests_part(rs, collector))
    mid = (edges[:-1] + edges[1:]) / 2
    for i in collector.models:
        start, end, size = collector.batch_series(i)
        q_t, q_n = collector.queue_series(i)
        busy = np.array([_busy_time(start, end, a, b) / (b - a) for a, b in itertools.pairwise(edges)])
        queue = np.array([_time_weighted_mean(q_t, q_n, a, b) for a, b in itertools.pairwise(edges)])
        name = names[i] if i < len(names) else f"model {i}"
        rs.models[name] = ModelSeries((mid, queue), (mid, busy), size.astype(float), np.ones(len(size)))
    return rs


def series_from_bench(out: Any) -> RunSeries:
    """A `tr bench` outcome: request figures from its collector; per-model ones from the polled counters
    (queue = waiting at each poll, busy = busy seconds / wall seconds and batch = rows / steps per interval)."""
    rs = RunSeries("live")
    _requests_part(rs, out.metrics)
    for name in out.model_names:
        rows = np.asarray(out.samples.rows.get(name, []), float).reshape(-1, 6)
        if len(rows) < 2:
            rs.models[name] = ModelSeries((np.empty(0),) * 2, (np.empty(0),) * 2, np.empty(0), np.empty(0))
            continue
        t, waiting, steps, nrows, step_s, busy_s = rows.T
        dt, dsteps = np.diff(t), np.diff(steps)
        mid = (t[:-1] + t[1:]) / 2
        in_steps = busy_s if np.isfinite(busy_s).all() else step_s  # an older server: summed step time
        with np.errstate(divide="ignore", invalid="ignore"):
            busy = np.clip(np.diff(in_steps) / dt, 0, 1)
            batch = np.where(dsteps > 0, np.diff(nrows) / dsteps, np.nan)
        k = max(1, len(t) // BINS)
        keep = dsteps > 0
        rs.models[name] = ModelSeries((t, _roll(waiting, k)), (mid, _roll(busy, k)), batch[keep], dsteps[keep])
    return rs


def _roll(x: np.ndarray, k: int) -> np.ndarray:
    """Centred rolling mean over k samples (the ends average what they have)."""
    w = np.ones(k)
    return np.convolve(x, w, mode="same") / np.convolve(np.ones(len(x)), w, mode="same")


def _figure(nrows: int, ncols: int, size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False).ravel()


def _cdf(ax, x: np.ndarray, **kw) -> bool:
    x = np.sort(x[~np.isnan(x)]) * 1e3
    if not len(x):
        return False
    ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", **kw)
    return True


def plot_series(runs: list[RunSeries], path: str | os.PathLike[str], title: str | None = None) -> str:
    """Draw one or more runs (solid = first, dashed = others) into a 4 x 2 grid and save it; returns the path."""
    build_figure(runs, title).savefig(path, dpi=100)
    return str(path)


def build_figure(runs: list[RunSeries], title: str | None = None):
    """The figure `plot_series` saves (a matplotlib `Figure`, no pyplot state)."""
    fig, axes = _figure(4, 2, (12.0, 13.0))
    ax_q, ax_busy, ax_hist, ax_thr, ax_ttft, ax_tpot, ax_e2e, ax_tok = axes
    names = list(dict.fromkeys(n for r in runs for n in r.models))
    colors = {n: f"C{k}" for k, n in enumerate(names)}
    for j, run in enumerate(runs):
        ls = "-" if j == 0 else "--"
        for n, m in run.models.items():
            lab = f"{n} ({run.label})"
            if len(m.queue[0]):
                ax_q.plot(*m.queue, ls, color=colors[n], label=lab)
            if len(m.busy[0]):
                ax_busy.plot(*m.busy, ls, color=colors[n], label=lab)
            if len(m.batch_sizes):
                hi = int(np.nanmax(m.batch_sizes)) + 1
                w = m.batch_weights / m.batch_weights.sum()
                ax_hist.hist(m.batch_sizes, bins=np.arange(0.5, hi + 1.5), weights=w, color=colors[n], ls=ls,
                             histtype="step" if j else "stepfilled", alpha=1.0 if j else 0.45, label=lab)  # fmt: skip
        if len(run.throughput[0]):
            ax_thr.plot(*run.throughput, ls, color="k", label=run.label)
        for ax, x in ((ax_ttft, run.ttft), (ax_tpot, run.tpot), (ax_e2e, run.e2e)):
            _cdf(ax, x, ls=ls, color="k", label=run.label)
    ax_q.set(xlabel="time (s)", ylabel="waiting requests (rolling mean)", title="Queue length per model")
    ax_busy.set(xlabel="time (s)", ylabel="busy fraction (rolling mean)", title="Busy fraction per model")
    ax_busy.set_ylim(0, 1.05)
    ax_hist.set(xlabel="batch size (rows per step)", ylabel="fraction of steps", title="Batch-size histogram")
    ax_thr.set(xlabel="time (s)", ylabel="output tokens / s", title="Output throughput over time")
    ax_ttft.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT CDF", ylim=(0, 1.02))
    ax_tpot.set(xlabel="TPOT (ms)", ylabel="fraction of requests", title="TPOT CDF", ylim=(0, 1.02))
    ax_e2e.set(xlabel="E2E latency (ms)", ylabel="fraction of requests", title="E2E latency CDF", ylim=(0, 1.02))
    _tokens_bars(ax_tok, runs, names, colors)
    for ax in axes:
        if ax.has_data():
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    if title:
        fig.suptitle(title)
    return fig


def _tokens_bars(ax, runs: list[RunSeries], names: list[str], colors: dict[str, str]) -> None:
    ax.set(title="Busy fraction, whole run", ylabel="mean busy fraction", ylim=(0, 1.05))
    width = 0.8 / max(len(runs), 1)
    for j, run in enumerate(runs):
        vals = [float(np.nanmean(run.models[n].busy[1])) if n in run.models and len(run.models[n].busy[1]) else 0.0
                for n in names]  # fmt: skip
        xs = np.arange(len(names)) + j * width
        ax.bar(xs, vals, width, color=[colors[n] for n in names], alpha=1.0 if j == 0 else 0.5,
               hatch=None if j == 0 else "//", label=run.label)  # fmt: skip
    ax.set_xticks(np.arange(len(names)) + width * (len(runs) - 1) / 2, names)


def plot_run(
    collector: MetricsCollector, path: str | os.PathLike[str], title: str | None = None, names: list[str] | None = None
) -> str:
    """`trsim run --plot`: one simulated run."""
    names = names or [f"model {i}" for i in collector.models]
    return plot_series([series_from_collector(collector, names, "sim")], path, title)


def plot_bench(out: Any, path: str | os.PathLike[str], sim: MetricsCollector | None = None) -> str:
    """`tr bench --plot`: the live run, with the simulator's run of the same cell dashed when given."""
    runs = [series_from_bench(out)]
    if sim is not None:
        runs.append(series_from_collector(sim, out.model_names, "sim"))
    return plot_series(runs, path, title=f"{out.served_model}: live" + (" vs simulated" if sim is not None else ""))


def plot_sweep(
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None,
    path: str | os.PathLike[str],
    title: str | None = None,
    logx: bool = False,
) -> str:
    """Line plot of ``y`` against ``x``, one line per value of ``hue`` (or one line if None); rows with the
    same (hue, x) are averaged. Returns the path written."""
    missing = [c for c in (x, y, hue) if c is not None and c not in df.columns]
    if missing:
        raise KeyError(f"columns not in the frame: {', '.join(missing)}")
    fig, (ax,) = _figure(1, 1, (7.0, 4.5))
    groups = [(None, df)] if hue is None else list(df.groupby(hue, sort=True))
    for key, g in groups:
        line = g.groupby(x, sort=True)[y].mean()
        label = None if hue is None else f"{hue}={key[0] if isinstance(key, tuple) else key}"
        ax.plot(line.index, line.to_numpy(), "o-", ms=4, label=label)
    ax.set(xlabel=x, ylabel=y, title=title or f"{y} vs {x}")
    if logx:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if hue is not None and groups:
        ax.legend()
    if df.empty:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.savefig(path, dpi=110)
    return str(path)
