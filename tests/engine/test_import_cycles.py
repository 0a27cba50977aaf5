"""The engine package has no import cycle, type-checking-only imports included (`engine/step_state.py` says why
the forward and the warmup read the engine through a protocol). The scanner itself is checked on a made-up
package with a cycle only a `TYPE_CHECKING` import closes."""

from __future__ import annotations

from pathlib import Path

from importscan import import_cycles

import tokenrouter.engine

ENGINE_DIR = Path(tokenrouter.engine.__file__).parent


def test_engine_package_has_no_import_cycle():
    assert len(list(ENGINE_DIR.rglob("*.py"))) >= 20
    assert import_cycles(ENGINE_DIR, "tokenrouter.engine") == []


def test_the_scanner_finds_a_cycle_closed_by_a_type_checking_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "runner.py").write_text("from pkg import forward\nfrom pkg.sub import leaf\n")
    (pkg / "forward.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.runner import Runner\n"
    )
    (pkg / "sub" / "leaf.py").write_text("import importlib\nops = importlib.import_module('pkg.sub.ops')\n")
    (pkg / "sub" / "ops.py").write_text("def f():\n    from pkg.sub import leaf\n")
    assert import_cycles(pkg, "pkg") == [["pkg.forward", "pkg.runner"], ["pkg.sub.leaf", "pkg.sub.ops"]]
    (pkg / "forward.py").write_text("x = 1\n")
    (pkg / "sub" / "ops.py").write_text("x = 1\n")
    assert import_cycles(pkg, "pkg") == []
