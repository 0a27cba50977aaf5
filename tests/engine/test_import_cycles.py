"""The engine package has no import cycle, type-checking-only imports included (`engine/step_state.py` says why
the forward and the warmup read the engine through a protocol). The scanner itself, and the whole project's graph,
are checked in tests/test_import_graph.py."""

from __future__ import annotations

from pathlib import Path

from importscan import import_cycles

import tokenrouter.engine

ENGINE_DIR = Path(tokenrouter.engine.__file__).parent


def test_engine_package_has_no_import_cycle():
    assert len(list(ENGINE_DIR.rglob("*.py"))) >= 20
    assert import_cycles(ENGINE_DIR, "tokenrouter.engine") == []
