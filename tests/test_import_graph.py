"""The project's import graph: no cycle of files, and no private name imported across modules (docs/design.md).

The graph spans `tokenrouter/` and the top-level folders pyproject maps into its namespace (`sim/` ->
`tokenrouter.sim`, ...), and counts every import: at module level, inside functions (a lazy import hides a cycle,
it does not remove it) and under `TYPE_CHECKING`. A cycle is reported as the list of its modules."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from importscan import folder_cycles, import_cycles, imported_modules, module_cycles, package_modules

ROOT = Path(__file__).resolve().parents[1]


def project_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the installed namespace."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mods: dict[str, Path] = {}
    for pkg, folder in dirs.items():
        mods.update(package_modules(ROOT / folder, pkg))
    return mods


def cycles_report(cycles: list[list[str]]) -> str:
    return "import cycles (each a list of modules that import one another):\n" + "\n".join(map(str, cycles))


def test_the_graph_spans_every_mapped_folder():
    mods = project_modules()
    assert len(mods) >= 150
    for m in ("tokenrouter.runtime.launcher", "tokenrouter.sim.run", "tokenrouter.calibration.profile",
              "tokenrouter.cli.tr"):  # fmt: skip
        assert m in mods


def test_no_import_cycle_among_project_files():
    cycles = module_cycles(project_modules())
    assert cycles == [], cycles_report(cycles)


def test_no_import_cycle_among_project_folders():
    cycles = folder_cycles(project_modules())
    assert cycles == [], "folder cycles (each a list of packages that import one another):\n" + "\n".join(
        map(str, cycles)
    )


def test_a_folder_cycle_without_a_file_cycle_is_reported(tmp_path):
    # a/x -> b/y and b/z -> a/w: no file imports back along its own path, the folders still depend on each other.
    pkg = tmp_path / "pkg"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from pkg.b import y\n")
    (pkg / "a" / "w.py").write_text("")
    (pkg / "b" / "y.py").write_text("")
    (pkg / "b" / "z.py").write_text("def f():\n    from ..a import w\n")
    mods = package_modules(pkg, "pkg")
    assert module_cycles(mods) == []
    assert folder_cycles(mods) == [["pkg.a", "pkg.b"]]


def test_a_function_level_import_that_closes_a_cycle_is_reported(tmp_path):
    """The project test fails on a cycle: one lazy import back from a low runtime module to the launcher."""
    assert _cycle_with_lazy_import(
        tmp_path,
        "tokenrouter.runtime.supervision",
        "from tokenrouter.runtime.launcher import Server",
        "tokenrouter.runtime.launcher",
    )


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


def test_the_scanner_resolves_relative_imports(tmp_path):
    """`from .x import y`, `from . import x` and `from ..x import y` count like their absolute spelling, lazy or
    not: a cycle among a package's own files cannot hide behind a leading dot."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .schema import Schema\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "schema.py").write_text(
        "class Schema: ...\n\ndef load():\n    from . import kinds\n    from .sub.guess import g\n"
    )
    (pkg / "kinds.py").write_text("from .schema import Schema\n")
    (pkg / "sub" / "guess.py").write_text("from ..schema import Schema\nfrom .. import kinds\n")
    assert import_cycles(pkg, "pkg") == [["pkg.kinds", "pkg.schema", "pkg.sub.guess"]]
    (pkg / "schema.py").write_text("class Schema: ...\n")
    assert import_cycles(pkg, "pkg") == []


def test_a_relative_lazy_import_that_closes_a_cycle_is_reported(tmp_path):
    """The project test fails on the cycle the resolver broke: the profile schema reaching back up to the estimate
    with a relative import inside a function."""
    assert _cycle_with_lazy_import(
        tmp_path,
        "tokenrouter.calibration.profile",
        "from .estimate import estimate_profile",
        "tokenrouter.calibration.estimate",
    )


def calibration_imports(mods: dict[str, Path], folder: str) -> list[str]:
    """`module -> calibration module` for each import of the calibration package by a module under `folder`."""
    known = set(mods)
    return [f"{m} -> {t}" for m, f in sorted(mods.items()) if m == folder or m.startswith(folder + ".")
            for t in sorted(imported_modules(f, known, m)) if t.startswith("tokenrouter.calibration")]  # fmt: skip


def test_deploy_imports_nothing_from_calibration():
    """Every subserver builds its deployment through `deploy/`; the cost model is the simulator's, so loading it
    there would be dead weight (the GPU-kind placements of `trsim tune` live in `sim.tune_layouts`)."""
    found = calibration_imports(project_modules(), "tokenrouter.deploy")
    assert found == [], "deploy imports calibration:\n" + "\n".join(found)


def test_the_deploy_check_sees_a_relative_import(tmp_path):
    mods = project_modules()
    probe = tmp_path / "placement.py"
    probe.write_text(mods["tokenrouter.deploy.placement"].read_text() + "\n\ndef f():\n"
                     "    from ..calibration.gpus import gpu_kind\n")  # fmt: skip
    mods["tokenrouter.deploy.placement"] = probe
    found = calibration_imports(mods, "tokenrouter.deploy")
    assert found == ["tokenrouter.deploy.placement -> tokenrouter.calibration.gpus"]


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """`from tokenrouter.<module> import _name` anywhere in `path` (dunder names are not private). A test's own
    helpers (`from rt_helpers import _x`) are not project modules and do not count."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tokenrouter":
            out += [f"{path.relative_to(root)}:{node.lineno}: {a.name} from {node.module}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]  # fmt: skip
    return out


def test_no_private_name_is_imported_from_another_module():
    files = [*project_modules().values(), *sorted((ROOT / "tests").rglob("*.py"))]
    found = [hit for f in files for hit in private_imports(f)]
    assert found == [], "private names imported across modules:\n" + "\n".join(found)


def test_the_private_import_check_sees_one(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("def g():\n    from tokenrouter.metrics import _ratio, __doc__\nfrom helpers import _x\n")
    assert private_imports(f, tmp_path) == ["probe.py:2: _ratio from tokenrouter.metrics"]


def _cycle_with_lazy_import(tmp_path, module: str, statement: str, target: str) -> bool:
    """Whether the project graph, with `statement` planted in a function at the end of a copy of `module`, has a
    cycle through `module` and `target`."""
    mods = project_modules()
    planted = tmp_path / (module.rsplit(".", 1)[-1] + ".py")
    planted.write_text(mods[module].read_text() + f"\n\ndef f():\n    {statement}\n")
    mods[module] = planted
    return any({module, target} <= set(c) for c in module_cycles(mods))
