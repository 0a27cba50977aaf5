"""Append-only JSONL logs a subserver writes for offline use (hop traces, step timelines). No file: no-op."""

from __future__ import annotations

import json
from typing import Any, TextIO


class JsonlLog:
    """One JSON object per line; flushed on close (and by the OS on exit)."""

    def __init__(self, path: str | None) -> None:
        self._f: TextIO | None = open(path, "a") if path else None  # noqa: SIM115 - closed in close()

    def write(self, obj: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
