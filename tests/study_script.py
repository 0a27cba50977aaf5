"""Load a study script (`studies/.../x.py`, not a package module) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_study(path: str | Path) -> ModuleType:
    """`studies/engine/graph_timing.py` (relative to the repository, or absolute) -> the module `graph_timing`,
    registered in sys.modules (dataclasses defined in it need that)."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod
