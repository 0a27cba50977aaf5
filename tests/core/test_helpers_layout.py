"""Test helpers must not shadow each other: pytest puts every test directory on `sys.path` (rootdir-less
"prepend" imports), so two helper modules with one name, or an import from `conftest`, resolve to whichever
directory was collected first and break `pytest tests/core tests/runtime` while each directory alone passes."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
    return out


def test_no_test_module_imports_from_conftest():
    bad = [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py") if "conftest" in _imported_modules(p)]
    assert not bad, f"import helpers from a uniquely named module, not conftest: {bad}"


def test_helper_module_names_are_unique_across_test_directories():
    helpers = [
        p
        for p in TESTS.rglob("*.py")
        if not p.name.startswith("test_") and p.name not in ("conftest.py", "__init__.py")
    ]
    counts = Counter(p.stem for p in helpers)
    dup = {
        name: sorted(str(p.relative_to(TESTS)) for p in helpers if p.stem == name)
        for name, n in counts.items()
        if n > 1
    }
    assert not dup, f"helper modules that shadow each other: {dup}"
