"""`tr calibrate`: profile the engine on this machine's GPU and write a measured profile for the simulator: what it
measures, resuming from OUT.partial.json, --refit and --merge are in docs/calibration.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from tokenrouter.calibration.fit_quality import poor_fits
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.cli.common import (
    CPU_PROFILE,
    CliError,
    Interrupted,
    check_output,
    parse_list,
    parse_sm_splits,
    require_extras,
)
from tokenrouter.cli.progress import counted, progress_bar

if TYPE_CHECKING:
    from tokenrouter.calibration.profiler.run import Calibration, Plan

DEFAULT_SPLITS = "100/100,70/100,60/40,40/60"
SPLITS_HELP = (f"MPS SM shares SMALL/LARGE in percent to measure each pair at (100/100 always). Default: "
               f"{DEFAULT_SPLITS} on cuda; 100/100 alone on cpu, which has no SM shares to split.")  # fmt: skip


Out = Annotated[Path, typer.Option("--out", "-o", help="Profile JSON to write.")]
Models = Annotated[list[str] | None, typer.Option("--model", "-m", help="A model to profile (repeat for several).")]
PlacementName = Annotated[str, typer.Option(help="mps: also measure each pair side by side on one GPU (CUDA MPS); "
                                             "separate: alone only.")]  # fmt: skip
Pairs = Annotated[list[str] | None, typer.Option(help="SMALL,LARGE pair to co-locate (repeat); default: the first "
                                                 "model with each other one.")]  # fmt: skip
SmSplits = Annotated[str | None, typer.Option(help=SPLITS_HELP)]
Routers = Annotated[str, typer.Option(help="Learned routers whose device parts to time on the small model, or 'none'.")]
Arrangements = Annotated[str, typer.Option(help="One-process alternatives to MPS measured per pair: stream-priority, "
                         "green-context (both engines in one process, one thread each), or 'none'.")]  # fmt: skip
MaxTokens = Annotated[int, typer.Option(help="Largest step in tokens (the engine's varlen graphs go this far; as the "
                      "deployment's scheduler.max_batch_tokens).")]  # fmt: skip
MaxDecode = Annotated[int, typer.Option(help="Largest decode batch measured.")]
_CORUN = "in the co-run grid, in tokens: decode batches up to 64, larger values passes of 12-token peer returns"
CorunSmall = Annotated[str, typer.Option(help=f"Passes of the small model {_CORUN}.")]
CorunLarge = Annotated[str, typer.Option(help=f"Passes of the large model {_CORUN} (what the large model runs when "
                       "the small one's runs come back).")]  # fmt: skip
Device = Annotated[str, typer.Option(help="cuda, or cpu (tiny models: a check of the tool, not a profile).")]
Deadline = Annotated[float | None, typer.Option(help="Stop starting new measurements after this many seconds "
                     "(resume later).")]  # fmt: skip
Quick = Annotated[bool, typer.Option("--quick", help="A few points per table (tool checks, CPU tests).")]
Refit = Annotated[bool, typer.Option("--refit", help="Only fit OUT.partial.json into OUT again (no measuring; CPU is "
                  "fine).")]  # fmt: skip
Merge = Annotated[list[Path] | None, typer.Option(help="Merge these measured profiles (same GPU; later ones win a "
                  "clash) into OUT, no measuring.")]  # fmt: skip
Link = Annotated[str | None, typer.Option(help="Also measure the tcp link to HOST:PORT, where `tokenrouter link-probe "
                 "--listen :PORT` runs: one-way latency (median of small round trips / 2) and bandwidth (large "
                 "messages) go into the profile's `link` (what `placement: cross-host` pays per peer message). "
                 "Without --model only the link is measured, into OUT (or a copy of --link-base).")]  # fmt: skip
LinkBase = Annotated[str | None, typer.Option(help="--link without --model: the profile (name or file) to copy with "
                     "the measured link into OUT; default OUT itself.")]  # fmt: skip


def calibrate(out: Out, model: Models = None, placement: PlacementName = "mps", pair: Pairs = None,
              sm_splits: SmSplits = None, routers: Routers = "r2r,citer,co-llm,r-stitch",
              arrangements: Arrangements = "none", max_tokens: MaxTokens = 2048, max_decode: MaxDecode = 64,
              corun_small: CorunSmall = "1,4,16,32,64", corun_large: CorunLarge = "1,4,16,64,128,256,512",
              device: Device = "cuda", deadline: Deadline = None, quick: Quick = False, refit: Refit = False,
              merge: Merge = None, link: Link = None, link_base: LinkBase = None) -> None:  # fmt: skip
    """Profile the engine on this GPU and write a measured profile (schema 2) for `trsim --profile`; with --link,
    measure the tcp link to another host too (or only that)."""
    from tokenrouter.calibration.profiler.assemble import assemble

    check_output(out, "--out")
    link_address = _link_address(link)
    if merge:
        from tokenrouter.calibration.profiler.assemble import merge as merge_profiles

        return _write(_with_link(merge_profiles([load_profile(p) for p in merge]), link_address), out)
    if refit:  # the partial's own plan: no measuring, so the flags that shape one do not matter
        return _write(_with_link(assemble(_partial(out)), link_address), out)
    if not model and link_address is not None:
        _link_only(link_address, out, link_base)
        return
    if not model:
        raise CliError("give at least one --model (or --merge FILES, or --link HOST:PORT)")
    _check_flags(placement, device)
    from tokenrouter.calibration.profiler.run import Calibration, command_line  # the extras it needs are checked

    plan = _plan(model, (pair or []) if placement == "mps" else None, sm_splits, routers, arrangements, corun_small,
                 corun_large, max_tokens=max_tokens, max_decode=max_decode, device=device, quick=quick)  # fmt: skip
    console = Console(stderr=True)
    cal = Calibration(plan, out, command_line(sys.argv[1:]), deadline)
    check_output(cal.partial_path, "--out")  # written after every task: checked before the first
    _measure(cal, console)
    _write(_with_link(assemble(cal.partial), link_address), out)


def _plan(models: list[str], pair: list[str] | None, sm_splits: str | None, routers: str, arrangements: str,
          corun_small: str, corun_large: str, **kw: Any) -> Plan:  # fmt: skip
    """The calibration the flags ask for (`pair` None: no co-location, --placement separate); `kw`: the Plan's
    own fields as given. --quick measures a small co-run grid."""
    from tokenrouter.calibration.profiler.run import Plan, colocated_pairs
    from tokenrouter.models import load_spec

    names = [load_spec(m).name for m in models]
    pairs = [] if pair is None else colocated_pairs(names, [parse_list(p, str, "--pair") for p in pair])
    if sm_splits is None:  # on a CPU every split would measure the same co-run again
        sm_splits = DEFAULT_SPLITS if kw.get("device", "cuda") == "cuda" else "100/100"
    splits = [(100, 100), *(s for s in parse_sm_splits(sm_splits) if s != (100, 100))] if pairs else [(100, 100)]
    router_list = [] if routers.strip().lower() == "none" else parse_list(routers, str, "--routers")
    plan = Plan(models=names, pairs=pairs, splits=splits, routers=router_list,
                corun_batches_a=parse_list(corun_small, int, "--corun-small"),
                corun_batches_b=parse_list(corun_large, int, "--corun-large"),
                arrangements=[] if arrangements == "none" else parse_list(arrangements, str, "--arrangements"),
                **kw)  # fmt: skip
    if plan.quick:
        plan.corun_batches_a, plan.corun_batches_b, plan.corun_held = [1, 2], [1, 2], [(1, 2)]
        plan.corun_context = 32
    return plan


def _partial(out: Path) -> dict[str, Any]:
    """OUT.partial.json as --refit reads it: the results, with the plan they were measured under."""
    from tokenrouter.calibration.profiler.run import PARTIAL_FORMAT

    path = out.with_name(out.name + ".partial.json")
    try:
        partial = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CliError(f"--refit: cannot read {path} ({e}); an interrupted `tr calibrate -o {out}` leaves it") from None
    if not isinstance(partial, dict) or partial.get("format") != PARTIAL_FORMAT:
        raise CliError(f"--refit: {path} is not a calibration partial of this version")
    return partial


def _measure(cal: Calibration, console: Console) -> None:
    """Run the calibration with one progress bar per task and print the tasks that failed; exit 3 when tasks are
    left (the measured ones stay in the partial file, for the same command to resume)."""
    with progress_bar(console, *counted("{task.description}")) as bar:
        bars: dict[str, TaskID] = {}

        def on_event(task: str, what: str, done: int, total: int) -> None:
            if task not in bars:
                bars[task] = bar.add_task(task, total=max(total, 1))
            if what == "failed":
                bar.update(bars[task], description=f"{task} [red]failed[/red]")
                bar.stop_task(bars[task])
            elif what != "start":
                bar.update(bars[task], completed=done, total=max(total, done, 1))

        cal.on_event = on_event
        try:
            complete = cal.run()
        except KeyboardInterrupt:  # the workers are stopped and what they measured is saved (`Calibration.run`)
            raise Interrupted(f"interrupted; what was measured is in {cal.partial_path}: run the same command "
                              "again to resume") from None  # fmt: skip
    for task, why in cal.partial.get("failed", {}).items():
        console.print(f"tr calibrate: {task} failed: {why}", soft_wrap=True)
    if not complete:
        left = cal.pending()
        console.print(f"tr calibrate: {len(left)} tasks left ({', '.join(left)}); measured so far is in "
                      f"{cal.partial_path}: run the same command again to resume", soft_wrap=True)  # fmt: skip
        raise typer.Exit(3)


def _check_flags(placement: str, device: str) -> None:
    if placement not in ("mps", "separate"):
        raise CliError(f"--placement must be mps or separate, got {placement!r}")
    if device not in ("cuda", "cpu"):
        raise CliError(f"--device must be cuda or cpu, got {device!r}")
    require_extras("calibrate", ("engine", "serve"))  # measuring runs the engine and the runtime's transport
    if device == "cuda":
        _require_cuda()


def _require_cuda() -> None:
    """Stop at once, with one line, on a machine without a CUDA device (every task would fail in its worker). Counts
    devices without creating a context (the workers are spawned, so this process may touch the driver)."""
    import torch

    if not torch.backends.cuda.is_built():
        why = f"torch {torch.__version__} is a CPU build"
    elif torch.cuda.device_count() == 0:
        why = f"torch {torch.__version__} sees no CUDA device (CUDA_VISIBLE_DEVICES, driver)"
    else:
        return
    raise CliError(f"no CUDA GPU here ({why}): tr calibrate measures the GPU it runs on; --device cpu --quick "
                   "checks the tool with the tiny models")  # fmt: skip


def _link_address(link: str | None) -> str | None:
    if link is None:
        return None
    from tokenrouter.calibration.profiler.link import probe_address

    try:
        _, address = probe_address(link)
    except ValueError as e:
        raise CliError(f"--link: {e}") from None
    return address


def _with_link(profile, address: str | None):  # type: ignore[no-untyped-def]
    """`profile` with the link to `address` measured into it (unchanged without --link)."""
    if address is None:
        return profile

    require_extras("calibrate --link", ("serve",), ("zmq",))
    from tokenrouter.calibration.profiler.link import apply_link, measure_link

    result = measure_link(address)  # a TimeoutError is an OSError: one line, exit 2 (`run_app`)
    Console(stderr=True).print(f"link to {address}: {result['latency_ms']:.3f} ms one way (median round trip "
                               f"{result['rtt_ms_median']:.3f} ms), {result['bandwidth_gbps']:.2f} Gbit/s")  # fmt: skip
    return apply_link(profile, result)


def _link_only(address: str, out: Path, base: str | None) -> None:
    source = base if base is not None else out
    if base is None and not out.exists():
        raise CliError(f"--link without --model updates a profile: {out} does not exist (give --link-base h200 "
                       "or a file to start from)")  # fmt: skip
    prof = _with_link(load_profile(source), address)  # ProfileError, OSError: one line, exit 2 (`run_app`)
    prof.save(out)
    Console().print(f"wrote {out}: link {prof.link.latency_ms} ms, {prof.link.bandwidth_gbps} Gbit/s")


def _write(profile, out: Path) -> None:  # type: ignore[no-untyped-def]
    profile.save(out)
    t = Table(title=f"{out}: {profile.gpu.name}, held-out error of each fit (median / max)")
    for col in ("model", "pass", "fit", "points", "knots", "error"):
        t.add_column(col)
    for name, m in profile.models.items():
        if m.passes is None:
            continue
        for kind in ("decode", "varlen", "eager"):
            tab = getattr(m.passes, kind)
            if tab is None:
                continue
            e = tab.errors.get(tab.fit)
            err = f"{e.median:.1%} / {e.max:.1%} ({e.points})" if e and e.points else "-"
            t.add_row(name, kind, tab.fit, str(len(tab.points)), str(len(tab.knots)), err)
    Console().print(t)
    for g in profile.colocation:
        e = g.errors.get("interp")
        err = f"{e.median:.1%} / {e.max:.1%} over {e.points} held-out cells" if e else "no held-out cells"
        splits = ", ".join(f"{s.share_a}/{s.share_b}" for s in g.shares)
        how = f"MPS splits {splits}" if g.arrangement == "mps" else f"{g.arrangement} {g.detail or ''}".strip()
        Console().print(f"co-location {g.model_a}+{g.model_b}: {how}; interpolation error {err}")
    for line in poor_fits(profile):
        Console().print(f"[yellow]warning: {line}; steps priced from this fit can be off as much[/yellow]",
                        soft_wrap=True)  # fmt: skip
    if profile.made_on_cpu:
        Console().print(f"[yellow]{out} {CPU_PROFILE}[/yellow]", soft_wrap=True)
    Console().print(f"wrote {out}")
