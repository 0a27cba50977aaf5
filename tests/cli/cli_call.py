"""Run a CLI's `main` in process as a user's shell would: its exit code and what it printed."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def call(main: Callable[[list[str]], object], argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `main(argv)`; `main` must end by SystemExit, as typer apps do."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err
