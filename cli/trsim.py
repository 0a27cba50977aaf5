"""`trsim`: the co-design simulator's command line (CPU only). Each command's module is imported only when it runs:
`trsim run` must start in a fraction of a second, and the Markov model's scipy alone takes half of one."""

from __future__ import annotations

import importlib
import sys

import typer

from tokenrouter.cli.common import new_app, run_app

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run_cmd", "run"), "sweep": ("sweep_cmd", "sweep"), "tune": ("tune_cmd", "tune"),
    "model": ("model_cmd", "model"), "cost": ("cost_cmd", "cost"), "validate": ("validate_cmd", "validate"),
    "profile": ("estimate_cmd", "profile"),
}  # fmt: skip
HELP = "Simulate token-level routing deployments (small + large model subservers) on a GPU profile."


def build_app(only: str | None = None) -> typer.Typer:
    """The app with every command, or with `only` (the command about to run)."""
    app = new_app("trsim", HELP)
    for name, (module, func) in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(getattr(importlib.import_module(f"tokenrouter.cli.{module}"), func))
    return app


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `trsim.app`: the whole app, built on first use
        return build_app()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    run_app(build_app(first if first in COMMANDS else None), "trsim", argv)


if __name__ == "__main__":
    main()
