"""Run plots shared by `trsim run --plot` and `tr bench --plot` (panels: docs/simulator.md, Metrics). A run becomes a
`RunSeries` first (from a simulator collector or a bench outcome), so the drawing has one input; matplotlib's object
API, imported lazily."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tokenrouter.core.policy import format_b
from tokenrouter.metrics import busy_time, time_weighted_mean

if TYPE_CHECKING:
    import pandas as pd

    from tokenrouter.metrics import MetricsCollector

__all__ = ["RunCell", "RunSeries", "cdf_axis_rule", "plot_bench", "plot_run", "plot_series", "plot_sweep",
    "series_from_collector"]  # fmt: skip

BINS = 40
# A latency CDF whose largest value is more than TAIL times its median would squeeze the bulk of the requests into the
# first fifth of a linear axis: such a CDF gets a log x axis, or with values <= 0 a linear one cut at p99.
TAIL = 5.0


class SimRun(Protocol):
    """What a run cell reads of a simulated run (`sim.run.SimResult`). A protocol, so this module imports nothing
    of the simulator, whose folder imports this one's (`tokenrouter.metrics`): no folder cycle."""

    config: Any  # sim.run.SimConfig: its deployment, concurrency and arrival rate
    thresholds: Sequence[int]


@dataclass(slots=True)
class RunCell:
    """The cell a run plot shows, for its title; None = not known (a live server reports only its models)."""

    models: list[str]
    router: str | None = None
    hop_rate: float | None = None
    policy: str | None = None
    thresholds: tuple[int, ...] | None = None
    concurrency: int | None = None  # closed-loop clients N
    arrival_rate: float | None = None  # open loop: Poisson requests / s (N does not apply)

    @classmethod
    def of_sim(cls, res: SimRun, models: list[str] | None = None) -> RunCell:
        """A simulated run's cell: thresholds as resolved for its N (`auto` filled in); `models` overrides the
        names (a bench names the server's models)."""
        dep, cfg = res.config.deployment, res.config
        names = list(models) if models is not None else [m.name for m in dep.models]
        n = None if cfg.arrival_rate else cfg.concurrency
        return cls(
            names, dep.router.name, dep.router.hop_rate, dep.policy_label, tuple(res.thresholds), n, cfg.arrival_rate
        )

    def title(self, head: str, unknown: str = "not known") -> str:
        """Two lines: `head: model + model`, then router, hop rate, policy, B and N (or the Poisson rate); the
        fields that are None are named at the end, followed by `unknown`."""
        load = f"Poisson {self.arrival_rate:g} req/s" if self.arrival_rate else None
        if load is None and self.concurrency is not None:
            load = f"N = {self.concurrency}"
        b = None
        if self.thresholds is not None:
            b = f"B = {format_b(self.thresholds)}"
            b += "" if self.policy in (None, "delayed") else " (no delay)"  # B holds back only the delayed policy
        fields = {
            "router": None if self.router is None else f"router {self.router}",
            "hop rate": None if self.hop_rate is None else f"hop rate {self.hop_rate:g}",
            "policy": None if self.policy is None else f"policy {self.policy}",
            "B": b,
            "N": load,
        }
        line = ", ".join(v for v in fields.values() if v is not None)
        missing = [k for k, v in fields.items() if v is None]
        if missing:
            line += ("; " if line else "") + f"{', '.join(missing)} {unknown}"
        return f"{head}: {' + '.join(self.models)}\n{line}"


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
    # Events to mark on the throughput axis: (time s, label), e.g. autotune's B changes and workload phases.
    marks: list[tuple[float, str]] = field(default_factory=list)


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
        busy = np.array([busy_time(start, end, a, b) / (b - a) for a, b in itertools.pairwise(edges)])
        queue = np.array([time_weighted_mean(q_t, q_n, a, b) for a, b in itertools.pairwise(edges)])
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


def cdf_axis_rule(values_ms: np.ndarray) -> str:
    """How a CDF panel shows `values_ms` (every run drawn on it): "linear"; "log" when the largest value is more than
    `TAIL` times the median and all are positive; "p99" (linear, cut there) when such a tail comes with values <= 0."""
    x = values_ms[np.isfinite(values_ms)]
    if len(x) < 2:
        return "linear"
    lo, med, hi = float(x.min()), float(np.median(x)), float(x.max())
    if hi <= 0 or med < 0 or (med > 0 and hi <= TAIL * med):
        return "linear"
    if lo > 0:
        return "log"
    return "p99" if np.percentile(x, 99) > lo else "linear"  # a cut needs room left of it


def _cdf_axis(ax, values_ms: np.ndarray, what: str) -> None:
    """Apply `cdf_axis_rule`; a p99 cut writes what it leaves out on the panel."""
    rule = cdf_axis_rule(values_ms)
    if rule == "log":
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        x = values_ms[np.isfinite(values_ms)]
        ax.set_xscale("log")
        # Plain numbers (3, 5, 10, 20 ms, not 3 x 10^0): 1-2-5 ticks over a couple of decades, powers of ten beyond.
        decades = np.log10(x.max() / x.min())
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{what} (ms, log scale)")
    elif rule == "p99":
        x = values_ms[np.isfinite(values_ms)]
        p99 = float(np.percentile(x, 99))
        ax.set_xlim(float(x.min()), p99)
        beyond = int((x > p99).sum())
        ax.set_xlabel(f"{what} (ms, cut at p99)")
        ax.text(0.98, 0.04, f"tail: {beyond} of {len(x)} above p99 {p99:.3g} ms, max {x.max():.3g} ms",
                ha="right", va="bottom", transform=ax.transAxes, fontsize=8, color="dimgray")  # fmt: skip


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
        for t, text in run.marks:
            ax_thr.axvline(t, ls=":", color="gray", lw=1)
            ax_thr.annotate(text, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                            fontsize=7, color="dimgray")  # fmt: skip
        for ax, x in ((ax_ttft, run.ttft), (ax_tpot, run.tpot), (ax_e2e, run.e2e)):
            _cdf(ax, x, ls=ls, color="k", label=run.label)
    for ax, what, attr in ((ax_ttft, "TTFT", "ttft"), (ax_tpot, "TPOT", "tpot"), (ax_e2e, "E2E latency", "e2e")):
        _cdf_axis(ax, np.concatenate([getattr(r, attr) for r in runs] or [np.empty(0)]) * 1e3, what)
    ax_q.set(xlabel="time (s)", ylabel="waiting requests (rolling mean)", title="Queue length per model")
    ax_busy.set(xlabel="time (s)", ylabel="busy fraction (rolling mean)", title="Busy fraction per model")
    ax_busy.set_ylim(0, 1.05)
    ax_hist.set(xlabel="batch size (rows per step)", ylabel="fraction of steps", title="Batch-size histogram")
    ax_thr.set(xlabel="time (s)", ylabel="output tokens / s", title="Output throughput over time")
    for ax, what in ((ax_ttft, "TTFT"), (ax_tpot, "TPOT"), (ax_e2e, "E2E latency")):
        if not ax.get_xlabel():  # `_cdf_axis` names a log or cut axis
            ax.set_xlabel(f"{what} (ms)")
        ax.set(ylabel="fraction of requests", title=f"{what} CDF", ylim=(0, 1.02))
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
    """One bar per (model, run), each its own legend entry: the colour is the model's, solid / hatched the run's."""
    ax.set(title="Busy fraction, whole run", ylabel="mean busy fraction", ylim=(0, 1.05))
    width = 0.8 / max(len(runs), 1)
    for j, run in enumerate(runs):
        for i, n in enumerate(names):
            busy = run.models[n].busy[1] if n in run.models else np.empty(0)
            val = float(np.nanmean(busy)) if len(busy) else 0.0
            ax.bar(i + j * width, val, width, color=colors[n], alpha=1.0 if j == 0 else 0.5,
                   hatch=None if j == 0 else "//", label=f"{n} ({run.label})")  # fmt: skip
    ax.set_xticks(np.arange(len(names)) + width * (len(runs) - 1) / 2, names)


def plot_run(collector: MetricsCollector, path: str | os.PathLike[str], title: str | None = None,
             names: list[str] | None = None, marks: list[tuple[float, str]] | None = None) -> str:  # fmt: skip
    """`trsim run --plot`: one simulated run; `marks` (time s, label) are drawn on the throughput axis."""
    names = names or [f"model {i}" for i in collector.models]
    series = series_from_collector(collector, names, "sim")
    series.marks = list(marks or [])
    return plot_series([series], path, title)


def plot_bench(out: Any, path: str | os.PathLike[str], sim: MetricsCollector | None = None,
               cell: RunCell | None = None) -> str:  # fmt: skip
    """`tr bench --plot`: the live run, with the simulator's run of the same cell dashed when given. `cell` names
    what ran in the title (default: only the server's models are known)."""
    runs = [series_from_bench(out)]
    if sim is not None:
        runs.append(series_from_collector(sim, out.model_names, "sim"))
    cell = cell or RunCell(list(out.model_names))
    head = "tr bench, live" + (" vs simulated" if sim is not None else "")
    return plot_series(runs, path, title=cell.title(head, unknown="not reported by the server (--sim gives them)"))


def plot_sweep(df: pd.DataFrame, x: str, y: str, hue: str | None, path: str | os.PathLike[str],
               title: str | None = None, logx: bool = False) -> str:  # fmt: skip
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
