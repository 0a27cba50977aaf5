"""`trsim model`: the Markov-chain throughput model from the command line (docs/markov.md, docs/cli.md): the last line
is T(B) in tok/s with `--thresholds`, else `B*=<B> T=<tok/s>` under a table over the feasible set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.cli.options import HOP_RATE_HELP
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import format_b
from tokenrouter.markov import MarkovModel, ThroughputResult, evaluate_thresholds, router_matrices, search_thresholds
from tokenrouter.markov.search import SEARCH_STATES
from tokenrouter.sim.propose import check_search_concurrency

ROUTERS = (RouterName.R2R, RouterName.R_STITCH, RouterName.ME)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"trsim: error: {message}", err=True)
    return typer.Exit(2)


def _numbers(text: str, what: str, kind: type[int] | type[float]) -> list:
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        noun = "integers" if kind is int else "numbers"
        raise _fail(f"{what} must be comma-separated {noun}, got {text!r}") from None


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


StepMs = Annotated[str | None, typer.Option("--step-ms", help="step time per model in ms, e.g. 6.0,27.9 (r2r) or "
                   "0.9,4.6,17.0 (me)")]  # fmt: skip
Router = Annotated[str, typer.Option("--router", help="r2r | r-stitch | me (--return-prob < 1 with r2r means "
                   "r-stitch)")]  # fmt: skip
HopRate = Annotated[float | None, typer.Option("--hop-rate", "-p", help=f"{HOP_RATE_HELP} (r2r, r-stitch)")]
HopProb = Annotated[float | None, typer.Option("--hop-prob", hidden=True, help="Deprecated: --hop-rate.")]
Concurrency = Annotated[int | None, typer.Option("--concurrency", "-n", help="closed-loop requests N; the search is "
                        "exact up to about N = 8 (two models, 0.1 ms quantum), larger N is reduced within "
                        "--max-states; N > 1024 is refused (the search would take minutes to hours)")]  # fmt: skip
Thresholds = Annotated[str | None, typer.Option("--thresholds", help="batching thresholds B, e.g. 1,3; omit to search "
                       "B*")]  # fmt: skip
MeanOutput = Annotated[float | None, typer.Option("--mean-output", help="mean output tokens per request: requests end "
                       "(geometric lengths) and new ones start at model 0, which breaks ME's lockstep; omit for "
                       "requests that never end")]  # fmt: skip
DeltaMs = Annotated[float, typer.Option("--delta-ms", help="time quantum in ms")]
ReturnProb = Annotated[float, typer.Option("--return-prob", help="r-stitch: P(large -> small) after a large step (1 = "
                       "R2R)")]  # fmt: skip
StepMsTable = Annotated[Path | None, typer.Option("--step-ms-table", help="JSON per-model step times L_i(b) for b = "
                        "1..N, instead of --step-ms")]  # fmt: skip
Top = Annotated[int, typer.Option("--top", help="rows of the search table to show (0 = all)")]
MaxStates = Annotated[int, typer.Option("--max-states", help="states one search or chain may explore and solve")]


def model(step_ms: StepMs = None, router: Router = "r2r", hop_rate: HopRate = None, hop_prob: HopProb = None,
          concurrency: Concurrency = None, thresholds: Thresholds = None, mean_output: MeanOutput = None,
          delta_ms: DeltaMs = 0.1, return_prob: ReturnProb = 1.0, step_ms_table: StepMsTable = None, top: Top = 0,
          max_states: MaxStates = SEARCH_STATES) -> None:  # fmt: skip
    """Markov-chain throughput model of delayed batching: T(B) in tok/s, or the best thresholds B*."""
    if hop_prob is not None:
        typer.echo("trsim: note: --hop-prob is deprecated; use --hop-rate", err=True)
        if hop_rate is not None and hop_rate != hop_prob:
            raise _fail("give --hop-rate only (--hop-prob is its deprecated spelling)")
        hop_rate = hop_prob
    if (step_ms is None) == (step_ms_table is None):
        raise _fail("give exactly one of --step-ms and --step-ms-table")
    steps: list = _numbers(step_ms, "--step-ms", float) if step_ms is not None else _load_table(step_ms_table)  # type: ignore[arg-type]
    key = router.lower()
    if key == RouterName.R2R and return_prob != 1.0:
        key = RouterName.R_STITCH
    if key not in ROUTERS:
        raise _fail(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")
    if key != RouterName.ME and len(steps) != 2:
        raise _fail(f"{key} needs 2 step times (small,large), got {len(steps)}")
    if key != RouterName.ME and hop_rate is None:
        raise _fail(f"--hop-rate is required for {key}")
    if key == RouterName.ME and hop_rate is not None:
        raise _fail("--hop-rate does not apply to me (every token visits every model)")
    if concurrency is None:
        raise _fail("--concurrency is required")
    if concurrency < 1:
        raise _fail(f"--concurrency must be positive, got {concurrency}")
    if max_states < 1:
        raise _fail(f"--max-states must be positive, got {max_states}")
    try:
        check_search_concurrency(concurrency)
        routing, commit = router_matrices(key, len(steps), hop_rate=hop_rate or 0.0, return_prob=return_prob)
        chain = MarkovModel.create(steps, routing, commit, concurrency, delta_ms, mean_output)
        b = chain.check_thresholds(_numbers(thresholds, "--thresholds", int)) if thresholds is not None else None
    except ValueError as exc:
        raise _fail(str(exc)) from None

    _print_header(key, hop_rate, return_prob, concurrency, mean_output, len(steps))
    try:
        if b is not None:
            res, used, note = evaluate_thresholds(chain, b, max_states)
            _print_quantum(used)
            _print_one(res, note)
        else:
            _print_search(chain, top, max_states)
    except ValueError as exc:  # the chain is too large even on the coarsest admissible quantum
        raise _fail(str(exc)) from None


def _print_header(key: str, hop: float | None, ret: float, n: int, mean_output: float | None, m: int) -> None:
    if key == RouterName.ME:
        kind = f"ME ensemble of {m} models"
    elif key == RouterName.R2R:
        kind = f"R2R, hop p={hop:g}"
    else:
        kind = f"R-Stitch-like, hop p={hop:g}, return p={ret:g}"
    ends = f"mean output {mean_output:g} tokens (geometric)" if mean_output else "requests never end"
    typer.echo(f"model: {kind}, N={n}, {ends}")


def _print_quantum(chain: MarkovModel) -> None:
    q = chain.step
    rounding = f"steps rounded, error <= {q.max_step_error_ms:.3g} ms" if q.max_step_error_ms else "steps exact"
    typer.echo(f"quantum: {q.delta_ms:g} ms x gcd {q.gcd} = {q.delta_eff_ms:g} ms; {rounding}")


def _print_one(res: ThroughputResult, note: str) -> None:
    b = format_b(res.thresholds)
    typer.echo(f"B={b}: {res.n_states} states")
    for i in range(len(res.thresholds)):
        typer.echo(f"model {i}: mean batch {res.mean_batch[i]:.3f}, busy {res.busy_fraction[i]:.3f}, "
                   f"mean queue {res.mean_queue[i]:.3f}, {res.batches_per_s[i]:.1f} batches/s")  # fmt: skip
    if note:
        typer.echo(f"note: {note}")
    typer.echo("throughput (tok/s):")
    typer.echo(f"{res.throughput_tok_s:.2f}")


def _print_search(chain: MarkovModel, top: int, max_states: int) -> None:
    out = search_thresholds(chain, max_states)
    _print_quantum(out.model)
    table = Table(title=f"T(B) over {len(out.ranked)} thresholds")
    for col in ("B", "T (tok/s)", "mean batch", "busy", "states"):
        table.add_column(col, justify="right")
    for res in out.ranked[: top or None]:
        table.add_row(format_b(res.thresholds), f"{res.throughput_tok_s:.2f}", _fmt(res.mean_batch),
                      _fmt(res.busy_fraction), str(res.n_states))  # fmt: skip
    Console().print(table)
    if out.note:
        typer.echo(f"note: {out.note}")
    t = "n/a" if out.throughput_tok_s is None else f"{out.throughput_tok_s:.2f}"
    typer.echo(f"B*={format_b(out.thresholds)} T={t}")
