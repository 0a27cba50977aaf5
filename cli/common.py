"""Shared CLI plumbing: one-line errors with exit code 2, list parsing (flags and the deployment: `options`)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer


def _click_classes(name: str) -> tuple[type[Exception], ...]:
    """The click exception class `name` as the installed typer raises it (empty if neither module has it): a recent
    typer vendors click as `typer._click`, older ones depend on click; the base install needs nothing typer lacks."""
    found: list[type[Exception]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            exc = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(exc, name):
            found.append(getattr(exc, name))
    return tuple(found)


USAGE_ERRORS = _click_classes("UsageError")
_ABORTS = (*_click_classes("Abort"), typer.Abort)  # typer 0.29 keeps Abort out of its vendored exceptions


PIPE_WIDTH = 120  # columns of rich output that is not a terminal


class CliError(ValueError):
    """A user error: printed as one line, exit code 2."""


class RunFailed(RuntimeError):
    """A run that started and could not go on (a subserver failed during start-up): one line, exit code 1."""


class Interrupted(RuntimeError):
    """Ctrl-C (or SIGTERM) ended the command; the message says what was kept or stopped: one line, exit code 130."""


# Top-level modules of each optional extra (pyproject's [project.optional-dependencies]) that commands import.
EXTRA_MODULES = {
    "serve": ("tokenizers", "zmq", "fastapi", "pydantic", "uvicorn", "prometheus_client", "httpx"),
    "engine": ("torch", "safetensors"),
    "ray": ("ray",),
}


# The torch the README installs on a machine without a GPU (a plain `torch` pulls a multi-GB CUDA build); the
# install hint below repeats it, and a test keeps the two the same.
CPU_TORCH = "torch==2.13.0"
_EXTRAS_ORDER = ("engine", "serve", "ray")  # as the README writes `.[engine,serve]`


def install_hint(extras: list[str]) -> str:
    """The README's install command for `extras`, run in the repository (the package is installed from source)."""
    names = sorted(extras, key=_EXTRAS_ORDER.index)
    pin = f'"{CPU_TORCH}" ' if "engine" in names else ""
    tail = " (the CPU torch; on a GPU machine leave out the pin)" if pin else ""
    return f'in the repository, pip install {pin}-e ".[{",".join(names)}]"{tail}'


def require_extras(command: str, extras: tuple[str, ...], modules: tuple[str, ...] | None = None) -> None:
    """Fail with one line naming the missing extra(s) and modules, and how to install them, when `command` runs in
    an install without them (the simulator installs light). `modules` narrows the check; nothing is imported."""
    missing: dict[str, list[str]] = {}
    for extra in sorted(extras, key=_EXTRAS_ORDER.index):
        wanted = [m for m in EXTRA_MODULES[extra] if modules is None or m in modules]
        gone = [m for m in wanted if importlib.util.find_spec(m) is None]
        if gone:
            missing[extra] = gone
    if not missing:
        return
    names = list(missing)
    what = f"the '{names[0]}' extra" if len(names) == 1 else "the " + " and ".join(f"'{n}'" for n in names) + " extras"
    mods = ", ".join(m for ms in missing.values() for m in ms)
    raise CliError(f"{command} needs {what} (missing: {mods}): {install_hint(names)}")


def fail(prog: str, msg: str, code: int = 2) -> NoReturn:
    print(f"{prog}: error: {msg.splitlines()[0] if msg else 'invalid input'}", file=sys.stderr)
    raise SystemExit(code)


def new_app(name: str, help: str) -> typer.Typer:
    """A command-line app as both of ours are made: help without arguments, no shell-completion commands, plain
    tracebacks (`run_app` turns user errors into one line), and `PROG --version` (the installed package's)."""
    app = typer.Typer(name=name, help=help, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

    def show(ctx: typer.Context, value: bool) -> None:
        if value:
            from importlib.metadata import version

            typer.echo(f"{ctx.find_root().info_name} (tokenrouter) {version('tokenrouter')}")
            raise typer.Exit()

    @app.callback()
    def _root(
        _version: bool = typer.Option(False, "--version", is_eager=True, callback=show, help="Print the version."),
    ) -> None:
        pass

    return app


def run_app(app: typer.Typer, prog: str, argv: list[str] | None = None) -> None:
    """Run a typer app so every user error (click's usage errors, our ValueErrors) is one line on stderr with exit
    code 2, never a traceback. Output to a pipe or file is PIPE_WIDTH columns wide unless COLUMNS is set."""
    piped = "COLUMNS" not in os.environ and not sys.stdout.isatty()
    if piped:
        os.environ["COLUMNS"] = str(PIPE_WIDTH)  # rich reads it at every print
    try:
        rc = app(args=argv, prog_name=prog, standalone_mode=False)
    except USAGE_ERRORS as e:
        fail(prog, e.format_message())
    except Interrupted as e:
        fail(prog, str(e), code=130)
    except _ABORTS:  # click's word for a Ctrl-C it caught
        fail(prog, "interrupted", code=130)
    except (ValueError, OSError) as e:
        fail(prog, str(e) or type(e).__name__)
    except RunFailed as e:
        fail(prog, str(e), code=1)
    finally:
        if piped:
            os.environ.pop("COLUMNS", None)
    if rc == 130:  # a recent typer's word for a Ctrl-C it caught (silently; older ones raise Abort, above)
        fail(prog, "interrupted", code=130)
    raise SystemExit(rc if isinstance(rc, int) else 0)


def check_output(path: str | Path | None, flag: str, *, figure: bool = False) -> None:
    """Refuse an output destination that cannot be written before any work is done (a long sweep otherwise fails
    only when it writes); a figure's suffix must be a format matplotlib saves. None and '-' (stdout) pass."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{flag} {p}: is a directory, not a file")
    if not p.parent.is_dir():
        raise CliError(f"{flag} {p}: no such directory {p.parent} (create it first)")
    if why := _unwritable(p):
        raise CliError(f"{flag} {p}: cannot write there ({why})")
    if figure and p.suffix:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        if p.suffix[1:].lower() not in formats:
            raise CliError(f"{flag} {p}: cannot write a figure as {p.suffix!r}; use one of .{', .'.join(formats)}")


def _unwritable(p: Path) -> str:
    """Why `p` cannot be written ("" if it can). Tried, not asked: os.access says yes to root, and a sandbox refuses
    what the mode bits allow. An existing file is opened for appending (unchanged); else a scratch file beside it."""
    import tempfile

    try:
        if p.exists():
            with p.open("ab"):
                pass
        else:
            fd, scratch = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=p.parent)
            os.close(fd)
            os.unlink(scratch)
    except OSError as e:
        return e.strerror or type(e).__name__
    return ""


CPU_PROFILE = ("was measured on CPU by tr calibrate --device cpu: it checks the tool, not a GPU's speed; do not choose "
               "B or read throughput from it")  # fmt: skip


def note_cpu_profile(prog: str, name: str) -> None:
    """One line on stderr when profile `name` was measured on CPU, so a result priced with it is not taken for a
    GPU's. Silent for any other profile, and for one that does not load (the command says why)."""
    from tokenrouter.calibration.resolve import load_profile

    try:
        made_on_cpu = load_profile(name).made_on_cpu
    except (ValueError, OSError):
        return
    if made_on_cpu:
        typer.echo(f"{prog}: profile {name} {CPU_PROFILE}", err=True)


def parse_list(text: str, conv: Callable[[str], Any], what: str) -> list[Any]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise CliError(f"{what}: expected a value or a comma-separated list, got {text!r}")
    try:
        return [conv(t) for t in items]
    except ValueError:
        raise CliError(f"{what}: cannot parse {text!r}") from None


def parse_sm_splits(text: str) -> list[tuple[int, int]]:
    """`--sm-splits SMALL/LARGE,...`: MPS SM shares in percent (each 1..100), in the order given."""
    out = []
    for item in parse_list(text, str, "--sm-splits"):
        a, sep, b = item.partition("/")
        if not sep or not a.isdigit() or not b.isdigit() or not (1 <= int(a) <= 100 and 1 <= int(b) <= 100):
            raise CliError(f"--sm-splits: {item!r} is not SMALL/LARGE percentages (each 1..100), e.g. 40/60")
        out.append((int(a), int(b)))
    return out
