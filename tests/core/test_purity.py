"""The core is shared by the simulator and the runtime, so it must not pull in either's machinery."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

from importscan import imported_roots

import tokenrouter.core

FORBIDDEN = {"simpy", "asyncio", "zmq", "torch", "triton", "fastapi", "uvicorn", "threading", "time", "socket"}
CORE_DIR = Path(tokenrouter.core.__file__).parent


def test_core_sources_import_nothing_forbidden():
    files = sorted(CORE_DIR.glob("*.py"))
    assert len(files) >= 8
    for f in files:
        bad = imported_roots(f) & FORBIDDEN
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_importing_core_loads_no_forbidden_module():
    mods = [f"tokenrouter.core.{m.name}" for m in pkgutil.iter_modules([str(CORE_DIR)])]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in mods)
        + f"bad = sorted({sorted(FORBIDDEN - {'time', 'threading', 'socket'})!r})\n"
        + "print(','.join(m for m in bad if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
