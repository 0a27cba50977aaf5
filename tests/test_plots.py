"""The shared run plots: per-model panels named by model, live and simulated overlaid, a PNG on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from tokenrouter.metrics import MetricsCollector
from tokenrouter.plots import RunCell, build_figure, cdf_axis_rule, plot_run, series_from_collector

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


def _bar_axis(fig):
    return next(a for a in fig.axes if a.get_title() == "Busy fraction, whole run")


@pytest.mark.parametrize("labels", [("sim",), ("live", "sim")])
def test_whole_run_bars_have_one_legend_entry_each(labels):
    names = ["tiny-small", "tiny-large"]
    runs = [series_from_collector(_collector(), names, lab) for lab in labels]
    ax = _bar_axis(build_figure(runs, "t"))
    handles, texts = ax.get_legend_handles_labels()
    assert texts == [f"{n} ({lab})" for lab in labels for n in names]
    assert len(ax.containers) == len(handles)  # one bar series per (run, model), each in the legend
    assert [t.get_text() for t in ax.get_legend().get_texts()] == texts
    # Each swatch looks like its bar: the model's colour (C0, C1), the run's alpha.
    for k, h in enumerate(handles):
        j, i = divmod(k, len(names))
        assert h.patches[0].get_facecolor() == to_rgba(f"C{i}", 1.0 if j == 0 else 0.5)


def test_cdf_axis_rule():
    rng = np.random.default_rng(0)
    bulk = rng.uniform(3.0, 5.0, 92)
    assert cdf_axis_rule(np.concatenate([bulk, [35.0, 45.0, 58.0, 107.0]])) == "log"  # the #15 TTFT shape
    assert cdf_axis_rule(rng.uniform(3.9, 6.5, 64)) == "linear"
    assert cdf_axis_rule(np.array([700.0, 3900.0, 4100.0, 10400.0])) == "linear"  # max < 5 x median
    assert cdf_axis_rule(np.concatenate([np.zeros(10), bulk, [200.0]])) == "p99"  # a log axis would drop the 0s
    assert cdf_axis_rule(np.array([5.0])) == "linear"
    assert cdf_axis_rule(np.array([np.nan, 1.0, 1.0, 100.0])) == "log"


def test_cdf_panels_follow_the_rule():
    rs = series_from_collector(_collector(), ["a", "b"], "sim")
    rs.ttft = np.concatenate([np.full(92, 0.004), np.linspace(0.03, 0.107, 8)])  # seconds
    rs.tpot = np.concatenate([np.zeros(5), np.linspace(0.004, 0.006, 94), [0.5]])
    rs.e2e = np.linspace(0.7, 10.4, 100)
    fig = build_figure([rs], "t")
    ttft, tpot, e2e = (next(a for a in fig.axes if a.get_title() == t) for t in TITLES[4:7])
    assert ttft.get_xscale() == "log" and "log" in ttft.get_xlabel()
    assert e2e.get_xscale() == "linear" and e2e.get_xlim()[1] >= 10400
    p99 = float(np.percentile(rs.tpot * 1e3, 99))
    assert tpot.get_xscale() == "linear" and tpot.get_xlim()[1] == pytest.approx(p99)
    notes = [t.get_text() for t in tpot.texts]
    assert len(notes) == 1 and "1 of 100 above p99" in notes[0] and "max 500 ms" in notes[0]


def test_title_names_the_cell():
    from tokenrouter.cli.options import DeploymentFlags
    from tokenrouter.deploy import DeploymentOverrides
    from tokenrouter.sim.simulate import sim_config, simulate

    ov = DeploymentOverrides(hop_rate=0.25, small="tiny-small", large="tiny-large", thresholds=[1, 3],
                             profile="h200-analytic")  # fmt: skip
    flags = DeploymentFlags(None, ov)
    cfg, auto = sim_config(flags.resolve(), flags.b_choice, concurrency=4, workload="fixed:8,12", num_requests=4)
    title = RunCell.of_sim(simulate(cfg, auto)).title("trsim run")
    head, line = title.split("\n")
    assert head == "trsim run: tiny-small + tiny-large"
    assert line == "router r2r, hop rate 0.25, policy delayed, B = 1,3, N = 4"
    assert build_figure([], title).get_suptitle() == title

    flags = DeploymentFlags(None, DeploymentOverrides(policy="eager"))
    cfg, auto = sim_config(flags.resolve(), flags.b_choice, arrival_rate=5.0, workload="fixed:8,12", num_requests=4)
    line = RunCell.of_sim(simulate(cfg, auto)).title("x").split("\n")[1]
    assert "policy eager" in line and "(no delay)" in line and "Poisson 5 req/s" in line and "N =" not in line

    live = RunCell(["a", "b"], concurrency=8).title("tr bench, live", unknown="not reported")
    assert live == "tr bench, live: a + b\nN = 8; router, hop rate, policy, B not reported"
