"""A stand-in subserver for `test_startup_lean`: writes the modules its process has loaded, then exits (which the
launcher reports as a failed start-up)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_modules(path: str) -> None:
    Path(path).write_text("\n".join(sorted(sys.modules)))
