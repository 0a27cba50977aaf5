"""`trsim cost`: the cost model's step time for one step, as the simulator prices it (docs/cli.md). The last line
printed is the predicted step time in ms (the lines above say how it was composed)."""

from __future__ import annotations

from typing import Annotated

import typer

from tokenrouter.calibration.cost import CostModel
from tokenrouter.calibration.interference import pair_interference
from tokenrouter.calibration.step_stats import SHORT_ROW_TOKENS, StepStats
from tokenrouter.cli.common import CliError
from tokenrouter.core.graph_rule import GraphRule
from tokenrouter.deploy.placement import check_tp_divides


def _corun(text: str) -> tuple[str, int]:
    name, sep, batch = text.rpartition(":")
    if not sep or not name:
        raise CliError(f"--corun must look like MODEL:BATCH, e.g. qwen3-32b:4; got {text!r}")
    try:
        b = int(batch)
    except ValueError:
        raise CliError(f"--corun batch must be an integer, got {batch!r}") from None
    if b < 1:
        raise CliError(f"--corun batch must be >= 1, got {b}")
    return name, b


Corun = Annotated[str | None, typer.Option(help="Co-located model stepping at the same time, MODEL:BATCH (decode "
                  "rows).")]  # fmt: skip
Tp = Annotated[int, typer.Option(help="Tensor-parallel degree of --model: the profile's entry at it, else an estimate "
               "from the tp=1 entry (printed as ESTIMATED).")]  # fmt: skip


def cost(
    model: Annotated[str, typer.Option(help="Model whose step is priced (a profile entry).")],
    batch: Annotated[int, typer.Option(help="Rows in the step.")] = 1,
    context: Annotated[int, typer.Option(help="Context tokens each row attends (after this step).")] = 1024,
    tokens_per_row: Annotated[int, typer.Option(help="Tokens each row feeds (1 = decode; more = extend rows).")] = 1,
    corun: Corun = None,
    sm_percent: Annotated[int, typer.Option(help="MPS SM share of --model in percent (100 = no cap).")] = 100,
    corun_sm_percent: Annotated[int, typer.Option(help="MPS SM share of the --corun model in percent.")] = 100,
    graphs: Annotated[bool, typer.Option("--graphs/--no-graphs", help="CUDA graphs.")] = True,
    tp: Tp = 1,
    profile: Annotated[str, typer.Option(help="Profile name (h200) or JSON file.")] = "h200",
) -> None:
    """Predicted step time (ms) of one step of --model: alone, under an SM cap, or beside a co-running model."""
    for what, v in (("--batch", batch), ("--tokens-per-row", tokens_per_row), ("--tp", tp)):
        if v < 1:
            raise CliError(f"{what} must be >= 1, got {v}")
    if tp > 1:
        check_tp_divides(model, tp)
    if context < tokens_per_row:
        raise CliError(f"--context ({context}) must be at least --tokens-per-row ({tokens_per_row})")
    for what, v in (("--sm-percent", sm_percent), ("--corun-sm-percent", corun_sm_percent)):
        if not 1 <= v <= 100:
            raise CliError(f"{what} must be in 1..100, got {v}")
    other = _corun(corun) if corun else None
    names = [model] + ([other[0]] if other else [])
    shares = [sm_percent] + ([corun_sm_percent] if other else [])
    cm = CostModel(profile, "mps", models=names, shares=shares, tp=[tp] + ([1] if other else []))
    mc = cm.for_model(0)
    rule = GraphRule(enabled=graphs)
    stats = StepStats.uniform(batch, tokens_per_row, context, rule)  # one pass, split as the engine splits
    alone = mc.step_ms(stats)
    kind = "decode graph" if stats.graph.rows else ("varlen pass" if graphs else "eager pass")
    tokens = batch * tokens_per_row
    at = f" at tp={tp}" if tp > 1 else ""
    typer.echo(f"{cm.models[0]}{at}: {batch} rows x {tokens_per_row} tokens, context {context} per row: {kind}, "
               f"{alone:.3f} ms alone ({cm.profile.kind} profile {cm.profile.gpu.name})")  # fmt: skip
    if mc.estimated:
        typer.echo(mc.estimated)
    if tokens_per_row > SHORT_ROW_TOKENS:
        typer.echo(f"rows of more than {SHORT_ROW_TOKENS} tokens are long rows of the varlen pass")
    factor = 1.0
    if other:
        f = cm.interference(0, 1)
        factor = f.factor(tokens, other[1])
        typer.echo(f"beside {cm.models[1]} at batch {other[1]} (SM {sm_percent}/{corun_sm_percent}): x{factor:.3f}")
        for note in cm.notes():
            if note != mc.estimated:
                typer.echo(note)
    elif sm_percent < 100:
        factor = _cap(cm, tokens, sm_percent)
        typer.echo(f"alone under an SM cap of {sm_percent}%: x{factor:.3f}")
    typer.echo(f"{alone * factor:.3f}")


def _cap(cm: CostModel, tokens: int, share: int) -> float:
    """The model's slowdown alone under `share`, from any measured pair that has a split giving it that share."""
    name = cm.models[0]
    for g in cm.profile.colocation:
        if g.arrangement != "mps" or name not in (g.model_a, g.model_b):
            continue
        for s in g.shares:
            mine, theirs = (s.share_a, s.share_b) if name == g.model_a else (s.share_b, s.share_a)
            if mine == share:
                return pair_interference(g, name, mine, theirs).cap(tokens)
    raise CliError(f"no measured split gives {name} an SM share of {share}% in profile {cm.profile.gpu.name}")
