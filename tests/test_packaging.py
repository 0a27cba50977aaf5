"""Packaging: every package folder is listed in pyproject (or a non-editable install silently drops it), and
every third-party import is a declared dependency."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from importscan import imported_roots

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


# Which optional extras cover the imports of a subpackage (beyond the base dependencies).
EXTRA_FOR: dict[str, str | tuple[str, ...]] = {
    "tokenrouter.calibration.profiler": ("engine", "serve"),  # `tr calibrate`: the engine and the runtime's IPC
    "tokenrouter.engine": "engine",
    "tokenrouter.routers.learned": "engine",
    "tokenrouter.models.tokenizer": "serve",
    "tokenrouter.runtime": "serve",
    "tokenrouter.runtime.ray_cluster": "ray",  # `tr serve --ray`
    "tokenrouter.runtime.tp_ranks": ("engine", "serve"),  # a tensor-parallel rank runs an engine (torch, lazily)
    "tokenrouter.bench": "serve",
    "tokenrouter.cli.bench_cmd": "serve",
    "tokenrouter.cli.bench_sim": "serve",  # `tr bench --sim` asks the server for its models
    "tokenrouter.cli.calibrate_cmd": ("engine", "serve"),  # checks the extras, then asks torch for a GPU (lazily)
    "tokenrouter.baselines": ("engine", "serve"),  # the model servers and the dispatcher (the cache itself is pure)
}


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_every_third_party_import_is_a_declared_dependency():
    """A module the base install imports must come from a declared dependency (not from something another
    package happens to bring in): a fresh `pip install -e .` must run the quick start."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {k: {_requirement_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dist_of = {m: [d.lower().replace("_", "-") for d in ds] for m, ds in packages_distributions().items()}
    problems = []
    for pkg, folder in cfg["package-dir"].items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            module = ".".join([pkg, *rel.parts])
            allowed = set(base)
            for prefix, extra in EXTRA_FOR.items():
                if module.startswith(prefix):
                    for name in (extra,) if isinstance(extra, str) else extra:
                        allowed |= extras[name]
            for root in imported_roots(path) - set(sys.stdlib_module_names) - {"tokenrouter", "__future__"}:
                dists = dist_of.get(root)
                if dists is None:
                    problems.append(f"{module}: imports {root}, which no installed distribution provides")
                elif not allowed & set(dists):
                    problems.append(f"{module}: imports {root} (from {dists[0]}), not a declared dependency")
    assert not problems, "\n".join(problems)
