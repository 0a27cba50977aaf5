"""The shared run plots: per-model panels named by model, live and simulated overlaid, a PNG on disk."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.metrics import MetricsCollector
from tokenrouter.plots import build_figure, plot_run, series_from_collector

TITLES = [
    "Queue length per model",
    "Busy fraction per model",
    "Batch-size histogram",
    "Output throughput over time",
    "TTFT CDF",
    "TPOT CDF",
    "E2E latency CDF",
    "Busy fraction, whole run",
]


def _collector() -> MetricsCollector:
    m = MetricsCollector(2)
    for k in range(6):
        rid = f"r{k}"
        m.on_arrival(rid, 0.1 * k, 10)
        for j in range(5):
            m.on_tokens(rid, 1, 0.1 * k + 0.05 * (j + 1), j % 2)
        m.on_finish(rid, 0.1 * k + 0.3, 4)
    for s in range(40):
        m.on_batch(s % 2, 0.02 * s, 0.02 * s + 0.015, 1 + s % 4)
        m.on_queue(s % 2, 0.02 * s, s % 3)
    return m


def test_figure_has_named_panels_and_model_legends():
    names = ["tiny-small", "tiny-large"]
    runs = [series_from_collector(_collector(), names, "live"), series_from_collector(_collector(), names, "sim")]
    fig = build_figure(runs, "t")
    axes = fig.axes
    assert [a.get_title() for a in axes] == TITLES
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend == ["tiny-small (live)", "tiny-large (live)", "tiny-small (sim)", "tiny-large (sim)"]
    assert axes[1].get_ylim()[1] <= 1.05
    busy = runs[0].models["tiny-small"].busy[1]
    assert 0 < busy.max() <= 1


def test_plot_run_writes_png(tmp_path: Path):
    out = plot_run(_collector(), tmp_path / "r.png", title="x", names=["a", "b"])
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_run(MetricsCollector(), tmp_path / "empty.png")  # nothing recorded still draws
