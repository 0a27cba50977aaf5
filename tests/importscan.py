"""Shared by the packaging, core-purity and import-cycle tests: which modules a source file imports
(`imported_roots`: absolute imports only, relative ones stay inside the package; `imported_modules`: relative
ones resolved too, so a cycle among a package's own files shows)."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def imported_modules(path: Path, known: set[str], module: str | None = None) -> set[str]:
    """Dotted names of the modules in `known` that `path` imports, anywhere in the file: at module level, inside
    functions, under `if TYPE_CHECKING:` (a cycle there is still a cycle of the design) and as a literal
    `importlib.import_module("...")`. `from pkg import name` counts `pkg.name` when that is a known module,
    else `pkg`. With `module` (the dotted name of `path`), relative imports (`from .x import y`, `from . import x`)
    count too, resolved against the package `path` lies in; without it they are skipped."""
    out: set[str] = set()
    package = None if module is None else module if path.name == "__init__.py" else module.rpartition(".")[0]

    def add(name: str) -> None:
        if name in known:
            out.add(name)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom) and (target := _from_target(node, package)) is not None:
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            out.update(subs)
            if len(subs) < len(node.names):
                add(target)
        elif isinstance(node, ast.Call) and _called_name(node) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(arg.value)
    return out


def _from_target(node: ast.ImportFrom, package: str | None) -> str | None:
    """The absolute dotted name a `from ... import` reads from; None for a relative one without a `package` to
    resolve it against (or one that climbs above the top-level package)."""
    if node.level == 0:
        return node.module
    if package is None:
        return None
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def package_modules(pkg_dir: Path, pkg_name: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under `pkg_dir` (`__init__.py` names the package)."""
    mods: dict[str, Path] = {}
    for f in sorted(pkg_dir.rglob("*.py")):
        parts = list(f.relative_to(pkg_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join([pkg_name, *parts])] = f
    return mods


def import_cycles(pkg_dir: Path, pkg_name: str) -> list[list[str]]:
    """Every strongly connected group of more than one module (or a module importing itself) in the package's
    import graph, each sorted, in sorted order; [] when the graph is acyclic."""
    return module_cycles(package_modules(pkg_dir, pkg_name))


def module_cycles(mods: dict[str, Path]) -> list[list[str]]:
    """`import_cycles` over the modules `mods` (dotted name -> source file), imports among them only."""
    known = set(mods)
    return graph_cycles({m: imported_modules(f, known, m) for m, f in mods.items()})


def folder_of(module: str, path: Path) -> str:
    """The package (folder) a module lives in: itself for a package's `__init__`, else its parent."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def folder_cycles(mods: dict[str, Path]) -> list[list[str]]:
    """Cycles among folders: folder A imports folder B when a module of A imports one of B (A != B). A cycle here
    with no file cycle is still two folders that cannot be understood, tested or moved one without the other."""
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for m, f in mods.items():
        a = folder_of(m, f)
        graph.setdefault(a, set())
        for t in imported_modules(f, known, m):
            b = folder_of(t, mods[t])
            if a != b:
                graph[a].add(b)
                graph.setdefault(b, set())
    return graph_cycles(graph)


def graph_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (or a node pointing at itself), each sorted, in sorted
    order."""
    # Tarjan's strongly connected components (iterative: no recursion limit on deep packages).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1 or node in graph[node]:
                    cycles.append(sorted(group))
    return sorted(cycles)
