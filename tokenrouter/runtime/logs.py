"""Logging of a server's processes (`configure_logging`: one format to stderr, so the processes' lines interleave
readably), and the append-only JSONL logs a subserver writes for offline use (hop traces, step timelines)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"
LEVELS = ("debug", "info", "warning", "error")
# Libraries whose INFO lines repeat what ours say (uvicorn's start-up banner, each HTTP client request).
_QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore")


def parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    return logging.getLevelNamesMapping()[level.upper()]


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is at each record: an in-process command may swap it and close the old one."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def configure_logging(level: str | int) -> None:
    """One stderr handler on the root logger, `level` for `tokenrouter.*`; noisy libraries at WARNING unless DEBUG."""
    lvl = parse_level(level)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(min(lvl, logging.WARNING))
    logging.getLogger("tokenrouter").setLevel(lvl)
    for name in _QUIET:
        logging.getLogger(name).setLevel(lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING))


class JsonlLog:
    """One JSON object per line; flushed on close (and by the OS on exit)."""

    def __init__(self, path: str | None) -> None:
        self._f: TextIO | None = open(path, "a") if path else None  # noqa: SIM115 - closed in close()

    @property
    def enabled(self) -> bool:
        return self._f is not None

    def write(self, obj: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
