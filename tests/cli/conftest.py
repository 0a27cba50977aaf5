from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _writable(d: Path) -> bool:
    probe = d / "probe"
    try:
        probe.write_text("x")
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody here can create files in. Mode bits stop a normal user but not root, so as root the folder
    is made immutable (`chattr +i`, EPERM as the issue saw it); skipped where neither works."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    immutable = False
    if _writable(d) and shutil.which("chattr"):
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    try:
        if _writable(d):
            pytest.skip("cannot make an unwritable folder here (root without chattr)")
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], capture_output=True)
        with contextlib.suppress(OSError):
            os.chmod(d, 0o755)
