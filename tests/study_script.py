"""Load a study script (`studies/.../x.py`, not a package module) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
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


def run_smoke(path: str | Path, out_dir: Path, timeout: float = 600,
              extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:  # fmt: skip
    """A kernel study (`studies/engine/x.py`) with `--smoke --out out_dir` (and `extra` arguments) in Triton's CPU
    interpreter, in a child process: the interpreter must be chosen before Triton is imported."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(ROOT / path), "--out", str(out_dir), "--smoke", *extra],
                          capture_output=True, text=True, env=env, timeout=timeout)  # fmt: skip


def smoke_result(path: str | Path, out_dir: Path, extra: tuple[str, ...] = ()) -> tuple[str, dict | list]:
    """`run_smoke`, which must exit 0: (its stdout, the JSON it wrote, `<script stem>.json` in `out_dir`)."""
    proc = run_smoke(path, out_dir, extra=extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out_dir / f"{Path(path).stem}.json").read_text())
