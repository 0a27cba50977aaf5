import io
import logging
import sys

import pytest

from tokenrouter.runtime.logs import configure_logging, parse_level


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ours = logging.getLogger("tokenrouter").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("tokenrouter").setLevel(ours)


def test_records_follow_stderr_after_the_stream_set_up_under_is_closed(restore_logging, monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info")  # as `tr serve` run in-process by a test harness: stderr is the harness's stream
    logging.getLogger("tokenrouter.test").info("one")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("tokenrouter.test").info("two")  # no "I/O operation on closed file"
    assert second.getvalue().rstrip().endswith("INFO tokenrouter.test: two")


def test_one_handler_however_often_it_is_configured(restore_logging, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    configure_logging("debug")
    configure_logging("warning")
    logging.getLogger("tokenrouter.test").info("hidden")
    logging.getLogger("tokenrouter.test").warning("shown")
    assert sys.stderr.getvalue().count("\n") == 1 and "shown" in sys.stderr.getvalue()


def test_a_bad_level_names_the_choices():
    with pytest.raises(ValueError, match="debug, info, warning, error"):
        parse_level("loud")
