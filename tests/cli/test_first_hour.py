"""What a newcomer meets in the first hour (issue: errors before loading, `--version`, a start-up summary)."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from tokenrouter.cli import tr, trsim


@pytest.mark.parametrize(
    ("main", "prog"), [(tr.main, "tr"), (tr.main_tokenrouter, "tokenrouter"), (trsim.main, "trsim")]
)
def test_version_prints_the_package_version(main, prog, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert int(e.value.code or 0) == 0
    assert capsys.readouterr().out.strip() == f"{prog} (tokenrouter) {version('tokenrouter')}"
