"""The Markov analysis is its own package: the core (what simulator and runtime share) must not need it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tokenrouter.core
import tokenrouter.markov


def test_core_imports_neither_scipy_nor_the_markov_package():
    core = Path(tokenrouter.core.__file__).parent
    mods = sorted(f"tokenrouter.core.{p.stem}" for p in core.glob("*.py") if p.stem != "__init__")
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods)
    code += "print(','.join(m for m in ('scipy', 'tokenrouter.markov') if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert not list(core.glob("markov*.py"))


def test_markov_imports_neither_deploy_nor_calibration():
    """The Markov package is math: what a deployment or a profile means is priced above it (`tokenrouter.deploy`).
    Imports anywhere in a file count (a function-level import too), relative ones resolved."""
    markov = Path(tokenrouter.markov.__file__).parent
    forbidden = ("tokenrouter.deploy", "tokenrouter.calibration", "tokenrouter.sim", "tokenrouter.runtime")
    for f in sorted(markov.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):  # `from ..deploy import x`: level 2 is the package tokenrouter
                package = ["tokenrouter", "markov"][: 3 - node.level] if node.level else []
                module = ".".join([*package, node.module or ""]).strip(".")
                names.update([module, *(f"{module}.{a.name}" for a in node.names)])
        bad = sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in forbidden))
        assert not bad, f"markov/{f.name} imports {bad}"
