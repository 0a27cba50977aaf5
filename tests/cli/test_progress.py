"""Progress off a terminal is lines, and an error leaves no bar behind it (issue 32, items 3 and 9)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from tokenrouter.cli import tr
from tokenrouter.cli.progress import ProgressLines, progress_bar

COLS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())


def _piped() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=120), buf


def test_off_a_terminal_a_task_that_ends_is_one_line():
    console, buf = _piped()
    with progress_bar(console, *COLS) as bar:
        task = bar.add_task("model/tiny-small", total=3)
        bar.advance(task, 3)
    assert buf.getvalue().splitlines() == ["model/tiny-small 3/3"]


def test_off_a_terminal_running_tasks_are_printed_when_due():
    """The heartbeat's logic, driven by hand (no clock in the test): nothing before `every_s`, then every running
    task, then nothing again until the next period."""
    console, buf = _piped()
    bar = Progress(*COLS, console=console, disable=True)
    a = bar.add_task("corun/a|b/100-100", total=9)
    bar.advance(a, 4)
    lines = ProgressLines(bar, console, every_s=10.0)
    lines.tick()
    assert buf.getvalue() == ""
    lines.last -= 10.0
    lines.tick()
    lines.tick()
    assert buf.getvalue().splitlines() == ["corun/a|b/100-100 4/9"]


def test_an_error_leaves_no_bar_behind():
    console, buf = _piped()
    with pytest.raises(ValueError), progress_bar(console, *COLS) as bar:
        bar.add_task("bench", total=2)
        raise ValueError("cannot benchmark")
    assert buf.getvalue() == ""


def test_an_unreachable_server_is_one_line_without_an_empty_bar(capsys):
    with pytest.raises(SystemExit) as e:
        tr.main(["bench", "--url", "http://127.0.0.1:9", "--num-requests", "2", "--workload", "fixed:4,4"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot benchmark" in err, err
