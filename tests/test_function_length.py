"""No function in the source is over 80 lines, one screen (a command parses flags and prints, its logic lives in
`sim/`, `deploy/` or `calibration/`; a long step reads as named parts). Nested functions count with the one
that holds them, as a reader meets them. Triton kernels (`@triton.jit`) are not counted: a kernel body is one
program the compiler sees whole, and splitting it costs registers or launches."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("tokenrouter", "sim", "calibration", "cli")
LIMIT = 80


def long_functions(root: Path, folders: tuple[str, ...] = SOURCE) -> list[tuple[str, str, int]]:
    out = []
    for folder in folders:
        for f in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_kernel(node):
                    n = node.end_lineno - node.lineno + 1
                    if n > LIMIT:
                        out.append((str(f.relative_to(root)), node.name, n))
    return out


def _is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated `@triton.jit` (or `@triton.jit(...)`)."""
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def test_no_function_is_over_the_limit():
    assert long_functions(ROOT) == []


def test_the_count_sees_a_long_nested_function(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "cmd.py").write_text(f"def register(app):\n    def run():\n{body}\n    return run\n")
    assert [(f, name) for f, name, _ in long_functions(tmp_path, ("cli",))] == [
        ("cli/cmd.py", "register"),
        ("cli/cmd.py", "run"),
    ]


def test_a_triton_kernel_is_not_counted_but_a_plain_function_is(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "tokenrouter").mkdir()
    (tmp_path / "tokenrouter" / "k.py").write_text(f"@triton.jit\ndef kern():\n{body}\n\ndef plain():\n{body}\n")
    assert [name for _, name, _ in long_functions(tmp_path, ("tokenrouter",))] == ["plain"]
