"""`trsim model`: the Markov-chain throughput model (DESIGN section 9) from the command line.

    trsim model --step-ms 6.0,27.9 --hop-prob 0.35 --concurrency 4 --thresholds 1,3 --delta-ms 0.1

With `--thresholds` the last line printed is T(B) in tok/s; without, a table over the feasible set sorted by
T, and the last line is `B*=<B> T=<tok/s>`. Two models: 0 small, 1 large; R2R routing by default, R-Stitch-like
geometric runs on the large model with `--return-prob`. Bad input exits with code 2 and one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.markov import MarkovModel, ThroughputResult, r2r_preset, rstitch_preset


def register(app: typer.Typer) -> None:
    """Add the `model` command to `app`."""
    app.command("model")(model)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"trsim: error: {message}", err=True)
    return typer.Exit(2)


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise _fail(f"{what} must be comma-separated numbers, got {text!r}") from None


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise _fail(f"{what} must be comma-separated integers, got {text!r}") from None


def _load_table(path: Path) -> list[list[float]]:
    """JSON: `[[L_0(1), L_0(2), ...], [L_1(1), ...]]` or `{"step_ms": <that>}`, in ms, b = 1..N at least."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read step table {path}: {exc}") from None
    if isinstance(data, dict):
        data = data.get("step_ms")
    if not (isinstance(data, list) and all(isinstance(row, list) for row in data)):
        raise _fail(f"step table {path} must be a list of per-model lists of step times (ms)")
    try:
        return [[float(x) for x in row] for row in data]
    except (TypeError, ValueError):
        raise _fail(f"step table {path} must hold numbers only") from None


def _fmt(values: tuple[float, ...], digits: int = 2) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


def model(
    step_ms: Annotated[
        str | None, typer.Option("--step-ms", help="step time per model in ms, small,large (e.g. 6.0,27.9)")
    ] = None,
    hop_prob: Annotated[float | None, typer.Option("--hop-prob", help="P(small -> large) after a step")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-n", help="closed-loop requests N")] = None,
    thresholds: Annotated[
        str | None, typer.Option("--thresholds", help="batching thresholds B, e.g. 1,3; omit to search B*")
    ] = None,
    delta_ms: Annotated[float, typer.Option("--delta-ms", help="time quantum in ms")] = 0.1,
    return_prob: Annotated[
        float, typer.Option("--return-prob", help="P(large -> small) after a large step (1 = R2R, one token)")
    ] = 1.0,
    step_ms_table: Annotated[
        Path | None,
        typer.Option("--step-ms-table", help="JSON per-model step times L_i(b) for b = 1..N, instead of --step-ms"),
    ] = None,
    top: Annotated[int, typer.Option("--top", help="rows of the search table to show (0 = all)")] = 0,
) -> None:
    """Markov-chain throughput model of delayed batching: T(B) in tok/s, or the best thresholds B*."""
    if (step_ms is None) == (step_ms_table is None):
        raise _fail("give exactly one of --step-ms and --step-ms-table")
    steps: list = _floats(step_ms, "--step-ms") if step_ms is not None else _load_table(step_ms_table)  # type: ignore[arg-type]
    if len(steps) != 2:
        raise _fail(f"need 2 step times (small,large), got {len(steps)}")
    if hop_prob is None or concurrency is None:
        raise _fail("--hop-prob and --concurrency are required")
    if concurrency < 1:
        raise _fail(f"--concurrency must be positive, got {concurrency}")
    try:
        routing, commit = rstitch_preset(hop_prob, return_prob) if return_prob != 1.0 else r2r_preset(hop_prob)
        chain = MarkovModel.create(steps, routing, commit, concurrency, delta_ms)
        b = chain.check_thresholds(_ints(thresholds, "--thresholds")) if thresholds is not None else None
    except ValueError as exc:
        raise _fail(str(exc)) from None

    kind = "R2R" if return_prob == 1.0 else f"R-Stitch-like (return p={return_prob:g})"
    q = chain.step
    typer.echo(f"model: {kind}, hop p={hop_prob:g}, N={concurrency}")
    rounding = f"steps rounded, error <= {q.max_step_error_ms:.3g} ms" if q.max_step_error_ms else "steps exact"
    typer.echo(f"quantum: {q.delta_ms:g} ms x gcd {q.gcd} = {q.delta_eff_ms:g} ms; {rounding}")
    try:
        if b is not None:
            _print_one(chain.throughput(b))
        else:
            _print_search(chain, top)
    except RuntimeError as exc:  # state-space cap: the quantum is too fine for this N
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_one(res: ThroughputResult) -> None:
    b = ",".join(map(str, res.thresholds))
    typer.echo(f"B={b}: {res.n_states} states")
    for i in range(len(res.thresholds)):
        typer.echo(
            f"model {i}: mean batch {res.mean_batch[i]:.3f}, busy {res.busy_fraction[i]:.3f}, "
            f"mean queue {res.mean_queue[i]:.3f}, {res.batches_per_s[i]:.1f} batches/s"
        )
    typer.echo("throughput (tok/s):")
    typer.echo(f"{res.throughput_tok_s:.2f}")


def _print_search(chain: MarkovModel, top: int) -> None:
    search = chain.best_thresholds()
    ranked = search.ranked()
    table = Table(title=f"T(B) over {len(ranked)} feasible thresholds")
    for col in ("B", "T (tok/s)", "mean batch", "busy", "states"):
        table.add_column(col, justify="right")
    for res in ranked[: top or None]:
        table.add_row(
            ",".join(map(str, res.thresholds)),
            f"{res.throughput_tok_s:.2f}",
            _fmt(res.mean_batch),
            _fmt(res.busy_fraction),
            str(res.n_states),
        )
    Console().print(table)
    typer.echo(f"B*={','.join(map(str, search.best))} T={search.best_throughput_tok_s:.2f}")
