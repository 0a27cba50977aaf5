"""PNG plots of a run and of a sweep.

Built on matplotlib's object API (``Figure`` + Agg canvas) rather than ``pyplot``: no global backend
switch, no figure registry to leak, safe on headless machines and from threads, and it leaves a caller's
interactive backend alone. matplotlib is imported inside the functions so importing the simulator does
not pay for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from tokenrouter.metrics import MetricsCollector

__all__ = ["plot_run", "plot_sweep"]


def _figure(nrows: int, ncols: int, size: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()


def _empty(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_run(collector: MetricsCollector, path: str | os.PathLike[str], title: str | None = None) -> str:
    """Three panels: queue length over time per model, batch size over time per model, latency CDF
    (E2E and TTFT of completed requests). Times in seconds. Returns the path written."""
    fig, (ax_q, ax_b, ax_l) = _figure(3, 1, (9.0, 10.0))
    models = collector.models

    drew = False
    for i in models:
        t, n = collector.queue_series(i)
        if len(t):
            ax_q.step(t, n, where="post", label=f"model {i}")
            drew = True
    ax_q.set(xlabel="time (s)", ylabel="waiting requests", title="Queue length")
    if drew:
        ax_q.legend(loc="upper right")
    else:
        _empty(ax_q)

    drew = False
    for i in models:
        start, _, size = collector.batch_series(i)
        if len(start):
            # One point per step: steps are too many and too short for bars to read.
            ax_b.plot(start, size, ".", ms=2, label=f"model {i}")
            drew = True
    ax_b.set(xlabel="time (s)", ylabel="batch size", title="Batch size per step")
    if drew:
        ax_b.legend(loc="upper right", markerscale=4)
    else:
        _empty(ax_b)

    done = collector.completed()
    drew = False
    for name, vals in (("E2E", [r.e2e for r in done]), ("TTFT", [r.ttft for r in done])):
        x = np.sort(np.asarray(vals, float))
        x = x[~np.isnan(x)]
        if len(x):
            ax_l.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=name)
            drew = True
    ax_l.set(xlabel="latency (s)", ylabel="fraction of requests", title="Latency CDF", ylim=(0, 1.02))
    if drew:
        ax_l.legend(loc="lower right")
    else:
        _empty(ax_l)

    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return str(path)


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
        _empty(ax)
    fig.savefig(path, dpi=110)
    return str(path)
