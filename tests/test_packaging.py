"""Every package folder must be listed in pyproject, or a non-editable install silently drops it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_all_package_dirs_are_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = {v: k for k, v in cfg["package-dir"].items()}
    found = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top not in mapping:
            continue
        found.add(".".join([mapping[top], *rel.parts[1:]]))
    assert found == listed
