"""`tr` and its collision-free twin `tokenrouter`: one app, and no script of the project calls `tr`."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tokenrouter.cli import tr

ROOT = Path(__file__).resolve().parents[2]


def _help(main, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert int(e.value.code or 0) == 0
    return capsys.readouterr().out


def _commands(help_text: str) -> list[str]:
    """Command names from the rich help's Commands panel."""
    panel = help_text.split("Commands")[-1]
    return sorted(m.group(1) for m in re.finditer(r"^│\s+([a-z][a-z-]+)\s", panel, flags=re.M))


def test_both_entry_points_list_the_same_commands(capsys):
    tr_cmds = _commands(_help(tr.main, capsys))
    tok_cmds = _commands(_help(tr.main_tokenrouter, capsys))
    assert tr_cmds == tok_cmds
    assert {"models", "check-config"} <= set(tr_cmds)


def test_console_scripts_point_at_the_same_app():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tr"].split(":")[0] == scripts["tokenrouter"].split(":")[0] == "tokenrouter.cli.tr"


@pytest.mark.skipif(shutil.which("tokenrouter") is None, reason="console scripts not installed")
def test_installed_tokenrouter_script_runs():
    out = subprocess.run(["tokenrouter", "models"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "qwen3-32b" in out.stdout


# A shell-level call of our CLI under the name `tr`: at a line start or after a pipe, `;`, `&&`, `$(` or a
# quote that opens an argv list.
_TR_CALL = re.compile(
    r"""(^|[|;&(]\s*|\$\(\s*|\[\s*["'])tr\b["']?\s*,?\s*["']?(serve|calibrate|bench|models|check-config)"""
)


def test_no_project_script_calls_tr():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    scripts = [f for f in files if f.endswith((".py", ".sh")) or f.startswith(".ci/")]
    offenders = []
    for f in scripts:
        for n, line in enumerate((ROOT / f).read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _TR_CALL.search(code):
                offenders.append(f"{f}:{n}: {line.strip()}")
    assert not offenders, "call `tokenrouter`, not `tr`:\n" + "\n".join(offenders)
