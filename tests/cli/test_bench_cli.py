"""`tokenrouter bench` against the front-end on the fake deployment: counts match what the fake produced,
JSON/CSV/plot are written, `--sim` adds the simulator's numbers, user errors are one line with exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from fake_backend import NAMES, expected_hops, expected_output
from live_server import start

from tokenrouter.cli.tr import main_tokenrouter


@pytest.fixture(scope="module")
def server():
    srv = start(token_delay_s=0.002)
    yield srv
    srv.close()


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        main_tokenrouter(argv)
    return int(e.value.code or 0)


def test_bench_counts_tokens_and_hops_exactly(server, tmp_path, capsys):
    out_json, out_csv, png = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,10", "--num-requests", "12", "-n", "4"]
    assert run([*argv, "--json", str(out_json), "--csv", str(out_csv), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "output throughput tok/s" in text and "tiny-large tokens" in text
    assert f"wrote {png}" in text
    assert "nan" not in text, "what a live bench cannot observe is shown as -"
    rec = json.loads(out_json.read_text())
    _, models = expected_output([0], 10)
    assert rec["requests_completed"] == 12 and rec["requests_failed"] == 0
    assert rec["total_output_tokens"] == 120 and rec["total_input_tokens"] == 96
    assert rec["tokens_model0"] == 12 * models.count(0) and rec["tokens_model1"] == 12 * models.count(1)
    assert rec["hops_mean"] == expected_hops(10)
    assert rec["models"] == ",".join(NAMES)
    # The fake reports 40 steps / 160 rows, constant: no steps ran between polls, so no batch figure.
    assert rec["batch_mean_model0"] is None
    df = pd.read_csv(out_csv)
    assert len(df) == 12 and (df["output_len"] == 10).all() and (df["num_hops"] == expected_hops(10)).all()
    assert png.stat().st_size > 10_000
    submits = [m for m in server.fake.received if type(m).__name__ == "Submit"]
    assert all(m.sampling.ignore_eos and m.sampling.max_tokens == 10 for m in submits)


def test_bench_poisson_and_sim(server, tmp_path, capsys, monkeypatch):
    import tokenrouter.plots as plots

    titles = []
    monkeypatch.setattr(plots, "plot_series", lambda runs, path, title=None: titles.append(title) or str(path))
    out_json, png = tmp_path / "p.json", tmp_path / "p.png"
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,6", "--num-requests", "6", "--arrival-rate", "200"]
    # --sim simulates what the server runs (the fake serves the tiny pair; any bundled shape prices analytically)
    sim = ["--sim", "--thresholds", "1,1", "--hop-rate", "0.2", *("--small", "tiny-small", "--large", "tiny-large"),
           "--profile", "h200-analytic"]  # fmt: skip
    assert run([*argv, *sim, "--json", str(out_json), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "live vs simulated" in text and f"wrote {png}" in text
    # The title's cell: the live models, router / hop rate / policy / B from the --sim flags, the arrival rate.
    assert titles == [f"tr bench, live vs simulated: {' + '.join(NAMES)}\n"
                      "router r2r, hop rate 0.2, policy delayed, B = 1,1, Poisson 200 req/s"]  # fmt: skip
    rec = json.loads(out_json.read_text())
    assert rec["requests_completed"] == 6 and rec["sim_requests_completed"] == 6
    assert rec["sim_total_output_tokens"] == rec["total_output_tokens"] == 36


def test_bench_user_errors(capsys):
    assert run(["bench", "--url", "http://127.0.0.1:9", "--num-requests", "2", "--workload", "fixed:4,4"]) == 2
    assert "cannot benchmark" in capsys.readouterr().err
    assert run(["bench", "--url", "http://127.0.0.1:9", "--workload", "nope"]) == 2


def test_bench_refuses_an_unwritable_output_before_sending(tmp_path, capsys):
    """The destination is checked before the run, so a long bench is not thrown away at the end (here the
    server is unreachable too: the output error comes first, so nothing was sent)."""
    argv = ["bench", "--url", "http://127.0.0.1:9", "--num-requests", "2", "--workload", "fixed:4,4"]
    assert run([*argv, "--csv", str(tmp_path / "no" / "b.csv")]) == 2
    err = capsys.readouterr().err
    assert "--csv" in err and "no such directory" in err and "cannot benchmark" not in err


def _poll(steps: float, rows: float, step_s: float, busy_s: float | None) -> str:
    """A /metrics page of one model as the front-end writes it (busy_s None: a server without the counter)."""
    lines = [
        'tokenrouter_requests_waiting{model="m"} 0.0',
        f'tokenrouter_steps_total{{model="m"}} {steps}',
        f'tokenrouter_step_rows_total{{model="m"}} {rows}',
        f'tokenrouter_step_seconds_total{{model="m"}} {step_s}',
    ]
    if busy_s is not None:
        lines.append(f'tokenrouter_busy_seconds_total{{model="m"}} {busy_s}')
    return "\n".join(lines) + "\n"


def _outcome(polls: list[tuple[float, str]]):
    from tokenrouter.bench.client import BenchOutcome
    from tokenrouter.bench.scrape import ServerSamples
    from tokenrouter.metrics import MetricsCollector

    mc = MetricsCollector(1)
    mc.on_arrival("r", 0.0, 4)
    mc.on_tokens("r", 8, 5.0, 0)
    mc.on_finish("r", 10.0, 0)  # the run lasts 10 s
    samples = ServerSamples()
    for t, text in polls:
        samples.add(t, text)
    return BenchOutcome(mc, samples, ["m"], "m")


def test_live_busy_is_the_union_of_step_intervals_and_unobserved_is_a_dash():
    from rich.console import Console

    from tokenrouter.cli.bench_cmd import live_summary
    from tokenrouter.cli.report import metrics_table

    # 100 steps of 4 rows; with overlap their summed time (12 s) exceeds the run (10 s), their union (9 s) not
    out = _outcome([(0.0, _poll(0, 0, 0.0, 0.0)), (10.0, _poll(100, 400, 12.0, 9.0))])
    s = live_summary(out)
    assert s["busy_frac_model0"] == pytest.approx(0.9) and s["batch_mean_model0"] == pytest.approx(4.0)
    # a server without the busy counter: busy not observed (not the summed step time)
    old = live_summary(_outcome([(0.0, _poll(0, 0, 0.0, None)), (10.0, _poll(100, 400, 12.0, None))]))
    assert old["batch_mean_model0"] == pytest.approx(4.0)
    console = Console(width=200, record=True)
    console.print(metrics_table(old, ["m"], "t", missing="-"))
    text = console.export_text()
    busy_row = next(line for line in text.splitlines() if "m busy" in line)
    batch_row = next(line for line in text.splitlines() if "m batch size" in line)
    assert "-" in busy_row and "%" not in busy_row
    assert [c.strip() for c in batch_row.split("│")[2:5]] == ["4.00", "-", "-"]  # mean, p50, p99
    assert "nan" not in text


def test_bench_phases_ramp_the_closed_loop(server, tmp_path):
    """A phase moves the number of workers while the bench runs: one request at a time before it, four after."""
    import asyncio

    from tokenrouter.bench.client import run_bench
    from tokenrouter.workloads import load_phases, make_workload

    spec = tmp_path / "ramp.json"
    phases = [{"at_s": 0, "concurrency": 1}, {"at_s": 0.3, "concurrency": 4}]
    spec.write_text(json.dumps({"workload": "fixed:8,10", "phases": phases}))
    specs = make_workload(str(spec), 80)
    out = asyncio.run(run_bench(server.url, specs, concurrency=8, arrival_rate=None, phases=load_phases(str(spec))))
    assert not out.errors and len(out.metrics.completed()) == 80
    assert [(round(t, 1), p.concurrency) for t, p in out.phases] == [(0.0, 1), (0.3, 4)]
    recs = list(out.metrics.records.values())

    def live(t: float) -> int:
        return sum(1 for r in recs if r.arrival <= t < r.finish)

    ramp = out.phases[1][0]
    before = [r.arrival for r in recs if r.arrival < ramp]
    assert before and max(live(t) for t in before) == 1  # --concurrency 8 was replaced by the phase at 0
    after = [r.arrival for r in recs if r.arrival > ramp]
    assert max(live(t) for t in after) == 4


def test_bench_hop_rate_phases_need_the_admin_key(tmp_path, capsys):
    spec = tmp_path / "hop.json"
    spec.write_text(json.dumps({"workload": "fixed:8,10", "phases": [{"at_s": 1, "hop_rate": 0.3}]}))
    assert run(["bench", "--url", "http://127.0.0.1:9", "--workload", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["tokenrouter: error: the workload's phases change the hop rate: give "
                                        "--admin-key (the server's)"]  # fmt: skip


def test_closed_loop_steady_window_ends_when_the_first_client_finds_no_request(server, tmp_path):
    """The live bench reports the simulator's steady window: from the start until a client first finds the workload
    exhausted; until then a client refills as soon as its request ends."""
    import asyncio

    from tokenrouter.bench.client import run_bench
    from tokenrouter.cli.bench_cmd import live_summary
    from tokenrouter.workloads import make_workload

    out = asyncio.run(run_bench(server.url, make_workload("fixed:8,10", 20), concurrency=4, arrival_rate=None))
    recs = list(out.metrics.records.values())
    # When a client finds nothing left, every request was taken and at most N - 1 are still running (the finder
    # holds none): at least 20 - 3 have finished by then (a window that ended at the 16th finish would not).
    assert out.exhausted_at is not None
    assert sum(1 for r in recs if r.finish <= out.exhausted_at) >= 20 - 3
    s = live_summary(out)
    in_window = sum(r.output_len for r in recs if r.finish <= out.exhausted_at)
    assert s["steady_output_throughput_tok_s"] >= in_window / out.exhausted_at  # and the unfinished tokens too


def test_duration_stops_sending_and_lets_running_requests_finish(server, tmp_path):
    """--duration: nothing is sent after the limit, nothing that was sent is cut, and the JSON says how many went
    out."""
    out_json = tmp_path / "d.json"
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,40", "--num-requests", "100000", "-n", "3",
            "--duration", "0.6", "--json", str(out_json)]  # fmt: skip
    assert run(argv) == 0
    rec = json.loads(out_json.read_text())
    assert 3 <= rec["requests_sent"] < 100000
    assert rec["requests_completed"] == rec["requests_sent"] and rec["requests_failed"] == 0
    assert rec["total_output_tokens"] == 40 * rec["requests_sent"]  # every request that went out ran to its end
    # duration_s runs from the first arrival (a moment after the limit's clock starts) to the last finish, so it
    # can end a hair under the limit: no timing bound here, the limit is only recorded.
    assert rec["duration_limit_s"] == 0.6 and rec["duration_s"] > 0


def test_duration_must_be_positive(capsys):
    assert run(["bench", "--url", "http://127.0.0.1:9", "--duration", "0"]) == 2
    assert "--duration must be a positive number" in capsys.readouterr().err


def test_a_server_that_goes_away_mid_run_keeps_the_results_and_exits_1(tmp_path, capsys):
    """The server stops after a few requests: the remaining ones fail at once, the table, JSON and CSV hold what
    was measured, and the exit code and one stderr line say that the run did not complete."""
    import threading
    import time

    srv = start(token_delay_s=0.01)

    def stop_after_4_submits():
        deadline = time.monotonic() + 60
        while sum(type(m).__name__ == "Submit" for m in srv.fake.received) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        srv.close()

    stopper = threading.Thread(target=stop_after_4_submits)
    stopper.start()
    out_json, out_csv = tmp_path / "gone.json", tmp_path / "gone.csv"
    try:
        argv = ["bench", "--url", srv.url, "--workload", "fixed:8,10", "--num-requests", "40", "-n", "2",
                "--json", str(out_json), "--csv", str(out_csv)]  # fmt: skip
        assert run(argv) == 1
    finally:
        stopper.join(60)
        srv.close()
    captured = capsys.readouterr()
    assert "output throughput tok/s" in captured.out
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(f"tokenrouter: error: the server at {srv.url} went away during the run"), captured.err
    rec = json.loads(out_json.read_text())
    assert rec["requests_completed"] >= 2 and rec["requests_failed"] >= 1
    assert rec["requests_completed"] + rec["requests_failed"] == rec["requests_sent"] == 40
    assert rec["total_output_tokens"] == 10 * rec["requests_completed"]
    assert len(pd.read_csv(out_csv)) >= rec["requests_completed"]


def _submits(server) -> int:
    return sum(type(m).__name__ == "Submit" for m in server.fake.received)


def test_sim_is_checked_before_any_request(server, capsys):
    """A simulated side that cannot run (a shape the measured profile lacks) or simulates other models than the
    server runs is refused in one line before the live run sends anything."""
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,6", "--num-requests", "4", "--sim"]
    before = _submits(server)
    assert run([*argv, "--small", "tiny-small", "--large", "tiny-large"]) == 2
    err = capsys.readouterr().err
    assert "has no model 'tiny-small'" in err and len(err.strip().splitlines()) == 1
    assert run([*argv, "--profile", "h200-analytic"]) == 2
    err = capsys.readouterr().err
    assert "runs tiny-small + tiny-large, the simulated deployment qwen3-0.6b + qwen3-32b" in err, err
    assert _submits(server) == before


def test_a_bench_ended_by_duration_counts_out_of_what_was_sent(server, tmp_path, capsys):
    out_json = tmp_path / "d.json"
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,6", "--num-requests", "400", "-n", "2"]
    assert run([*argv, "--duration", "0.3", "--json", str(out_json)]) == 0
    sent = json.loads(out_json.read_text())["requests_sent"]
    err = capsys.readouterr().err
    assert 0 < sent < 400 and f"{sent}/{sent}" in err and "/400" not in err, err


def test_sim_on_a_cpu_profile_says_what_it_is(server, tmp_path, capsys):
    """`--sim` priced with a profile `tr calibrate --device cpu` made: one line saying it checks the tool."""
    import msgspec

    from tokenrouter.calibration import load_profile

    cpu = msgspec.structs.replace(load_profile("h200-analytic"), device="cpu").save(tmp_path / "cpu.json")
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,6", "--num-requests", "4", "--sim",
            "--small", "tiny-small", "--large", "tiny-large", "--thresholds", "1,1", "--profile", str(cpu)]  # fmt: skip
    assert run(argv) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "measured on CPU" in line] == [
        f"tr bench --sim: profile {cpu} was measured on CPU by tr calibrate --device cpu: it checks the tool, not a "
        "GPU's speed; do not choose B or read throughput from it"
    ], err


def test_ctrl_c_keeps_and_prints_what_was_measured(server, tmp_path, monkeypatch, capsys):
    """Ctrl-C after the third request is done, while the fourth streams: the table and --json say what the three
    measured, marked interrupted; the fourth is cancelled, neither done nor failed, and the bar does not count it;
    exit 130 with one error line."""
    import signal

    import tokenrouter.bench.client as client

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("asyncio.run turns Ctrl-C into a cancel only under Python's default SIGINT handler")
    real, done = client._stream_one, []

    async def then_ctrl_c(*args, **kw):
        await real(*args, **kw)
        done.append(1)
        if len(done) == 3:
            signal.raise_signal(signal.SIGINT)  # what a terminal's Ctrl-C delivers

    monkeypatch.setattr(client, "_stream_one", then_ctrl_c)
    out_json = tmp_path / "i.json"
    argv = ["bench", "--url", server.url, "--workload", "fixed:8,10", "--num-requests", "20", "-n", "1"]
    assert run([*argv, "--json", str(out_json)]) == 130
    captured = capsys.readouterr()
    assert "INTERRUPTED" in captured.out and "output throughput tok/s" in captured.out
    rec = json.loads(out_json.read_text())
    assert rec["interrupted"] is True
    assert (rec["requests_sent"], rec["requests_completed"], rec["requests_cancelled"]) == (4, 3, 1)
    assert rec["requests_failed"] == 0 and rec["total_output_tokens"] == 30
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert errors == ["tokenrouter: error: interrupted after 3 of 20 requests (1 cancelled in flight); what was "
                      "measured is above"], captured.err  # fmt: skip
    assert "bench 3/4" in captured.err, "the bar counts the done requests, not the cancelled one"


def test_an_interrupted_bench_reports_busy_over_the_polls():
    """Interrupted, the server stepped on for the cancelled requests after the last one done (here: done at 10 s,
    polled until 20 s, 18 s busy): busy is over the polls' 20 s, 90%, not 180% over the done requests' 10 s."""
    from tokenrouter.cli.bench_cmd import live_summary

    out = _outcome([(0.0, _poll(0, 0, 0.0, 0.0)), (20.0, _poll(100, 400, 18.0, 18.0))])
    out.interrupted = True
    assert live_summary(out)["busy_frac_model0"] == pytest.approx(0.9)
