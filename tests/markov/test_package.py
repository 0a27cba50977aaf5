"""The Markov analysis is its own package: the core (what simulator and runtime share) must not need it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenrouter.core


def test_core_imports_neither_scipy_nor_the_markov_package():
    core = Path(tokenrouter.core.__file__).parent
    mods = sorted(f"tokenrouter.core.{p.stem}" for p in core.glob("*.py") if p.stem != "__init__")
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods)
    code += "print(','.join(m for m in ('scipy', 'tokenrouter.markov') if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert not list(core.glob("markov*.py"))
