"""`trsim tune`: choose delayed-batching thresholds per concurrency and write a deployment config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenrouter.cli.common import CliError, check_output, parse_list
from tokenrouter.cli.options import DeploymentFlags, DryRun, MaxOutput, Seed, Workload, deployment_flags
from tokenrouter.cli.run_cmd import sim_config
from tokenrouter.core.names import Layout, TuneObjective, parse_name
from tokenrouter.deploy.placement import gpus_used, layout
from tokenrouter.sim.run import estimated_notes
from tokenrouter.sim.tune import Candidate, check_search_concurrency, choose, tune_point


def register(app: typer.Typer) -> None:
    @app.command("tune")
    @deployment_flags()
    def tune(
        deploy: DeploymentFlags,
        out: Annotated[Path, typer.Option("--out", "-o", help="Deployment YAML to write.")] = Path("serve.yaml"),
        concurrency: Annotated[
            str,
            typer.Option(
                "--concurrency",
                "-n",
                help="Concurrencies to tune, e.g. 1,2,4,8,16. The Markov search is exact up to about N = 8; "
                "larger N runs a reduced search (coarser quantum, threshold grid, or B scaled from N/2) and says so; "
                "N > 1024 is refused.",
            ),
        ] = "1,2,4,8,16",
        workload: Workload = "low-effort",
        num_requests: Annotated[int, typer.Option(help="Requests per simulator check (default 4N, >= 32).")] = 0,
        top: Annotated[int, typer.Option(help="Markov candidates checked in the simulator per N.")] = 3,
        seed: Seed = 0,
        max_output: MaxOutput = None,
        sm_splits: Annotated[
            str | None,
            typer.Option(help="Also choose the MPS SM split, SMALL/LARGE percent, among these (e.g. 100/100,40/60): "
                         "the one whose tuned B simulates fastest at --compare-n is written. Needs a profile that "
                         "measured the pair at each split."),
        ] = None,
        placements: Annotated[
            str | None,
            typer.Option(help="Also choose where the models run, among these layouts on --num-gpus GPUs: mps (both on "
                         "GPU 0 under MPS; 1 GPU), separate (small on GPU 0, large on GPU 1; 2 GPUs), tp (the large "
                         "model tensor-parallel over all G GPUs, the small one beside it on GPU 0 under MPS; G GPUs). "
                         "Each is tuned with its own B; the best by --objective at --compare-n is written."),
        ] = None,
        num_gpus: Annotated[int, typer.Option(help="GPUs the --placements layouts may use (G).")] = 2,
        objective: Annotated[
            str, typer.Option(help="What --placements maximises: total (tok/s) or per-gpu (tok/s per GPU used).")
        ] = "total",
        compare_n: Annotated[
            int | None,
            typer.Option("--compare-n", "--split-n", help="Concurrency at which SM splits and placements are "
                         "compared (one of --concurrency; default 8 if tuned, else the largest)."),
        ] = None,
        dry_run: DryRun = False,
    ) -> None:
        """For each N: B* from the Markov model, the top candidates checked in the simulator; the measured best
        goes into the config's B(N) table, which `tr serve --config` follows as live concurrency changes.
        The deployment tuned is `--config` (or the default pair) with the flags applied; its policy becomes
        delayed. With --placements and/or --sm-splits every candidate deployment is tuned so, and the best at
        --compare-n is written."""
        if not dry_run:
            check_output(out, "--out")
        ns = sorted(set(parse_list(concurrency, int, "--concurrency")))
        if ns[0] < 1:
            raise ValueError("--concurrency values must be >= 1")
        check_search_concurrency(ns[-1])  # before any N is tuned
        if top < 1:
            raise CliError(f"--top must be >= 1 (Markov candidates simulated per N), got {top}")
        goal = parse_name(TuneObjective, objective, "--objective")
        layouts = [parse_name(Layout, x, "--placements") for x in parse_list(placements, str, "--placements")] \
            if placements else [None]  # fmt: skip
        if placements:
            given = [f for f in ("placement", "gpus", "tp") if getattr(deploy.overrides, f) is not None]
            if given:
                raise CliError(f"--placements sets placement, GPUs and tp per layout: leave out --{given[0]} (the "
                               "number of GPUs is --num-gpus)")  # fmt: skip
        deploy.overrides.policy = "delayed"
        deploy.overrides.thresholds = None
        deploy.thresholds_auto = False
        if dry_run:
            typer.echo(deploy.resolve().to_yaml().rstrip())
            return
        base = deploy.resolve()
        ref_n = compare_n if compare_n is not None else (8 if 8 in ns else ns[-1])
        if ref_n not in ns:
            raise CliError(f"--compare-n {ref_n} must be one of --concurrency {concurrency}")
        splits = _splits(sm_splits) if sm_splits else [None]
        plan: list[tuple[Layout | None, tuple[int, int] | None]] = []
        for lay in layouts:
            shared = lay is not Layout.SEPARATE and (lay is not None or base.placement.mode == "mps")
            plan += [(lay, sp) for sp in (splits if shared else [None])]
        layout_of = {lay: layout(lay, num_gpus, base) for lay in layouts if lay is not None}
        console = Console(stderr=True)
        candidates: list[Candidate] = []
        cols = (TextColumn("tune {task.fields[what]} N={task.fields[n]}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn())  # fmt: skip
        with Progress(*cols, console=console) as bar:
            task = bar.add_task("tune", total=len(ns) * len(plan), n=ns[0], what="")
            for lay, split in plan:
                label = " ".join(x for x in (str(lay) if lay else "", f"SM {split[0]}/{split[1]}" if split else "")
                                 if x) or str(base.placement.mode)  # fmt: skip
                if lay is not None:
                    mode, tps = layout_of[lay]
                    deploy.overrides.placement, deploy.overrides.tp, deploy.overrides.gpus = mode, tps, None
                if split is not None:
                    deploy.overrides.sm_percent = list(split)
                points, cfg = [], None
                for n in ns:
                    bar.update(task, n=n, what=label)
                    reqs = num_requests or max(32, 4 * n)
                    cfg, _ = sim_config(deploy, concurrency=n, workload=workload, num_requests=reqs, seed=seed,
                                        max_output=max_output)  # fmt: skip
                    points.append(tune_point(cfg, n, top=top))
                    bar.advance(task)
                assert cfg is not None
                dep = cfg.deployment
                candidates.append(Candidate(label, dep, points, gpus_used(dep), lay, split, estimated_notes(dep)))
        best = choose(candidates, ref_n, goal)
        table = {p.concurrency: p.best for p in best.points}
        dep = replace(best.deployment, policy=best.deployment.policy.with_thresholds(best.points[-1].best, table))
        if len(candidates) > 1:
            Console().print(_candidates_table(candidates, best, ref_n, goal))
        dep.notes = {
            "tuned_by": "trsim tune",
            "hop_rate": dep.router.hop_rate,
            "workload": workload,
            "profile": dep.profile,
            **_choice_notes(candidates, best, ref_n, goal, num_gpus, bool(placements), bool(sm_splits)),
            "points": [
                {
                    "N": p.concurrency,
                    "markov_B": list(p.prediction.thresholds),
                    "markov_tok_s": round(p.prediction.throughput, 1),
                    "chosen_B": list(p.best),
                    "sim_tok_s": round(p.best_throughput, 1),
                }
                for p in best.points
            ],
        }
        dep.save(out)
        names = " + ".join(m.name for m in dep.models)
        t = Table(title=f"trsim tune: {names}, {dep.router.name} hop rate {dep.router.hop_rate}, "
                  f"{best.label}, {workload}")  # fmt: skip
        for col in ("N", "Markov B*", "Markov tok/s", "sim tok/s @B*", "chosen B", "sim tok/s", "eager tok/s"):
            t.add_column(col, justify="right")
        eager = (1,) * len(dep.models)
        for p in best.points:
            t.add_row(
                str(p.concurrency),
                _b(p.prediction.thresholds),
                f"{p.prediction.throughput:,.0f}",
                f"{p.simulated[p.prediction.thresholds]:,.0f}",
                _b(p.best),
                f"{p.best_throughput:,.0f}",
                f"{p.simulated.get(eager, float('nan')):,.0f}",
            )
        Console().print(t)
        for p in best.points:
            if p.prediction.note:
                Console().print(f"N={p.concurrency}: {p.prediction.note}")
        for note in dict.fromkeys(n for c in candidates for n in c.estimated):
            Console().print(f"[yellow]{note}[/yellow]")
        Console().print(f"wrote {out}")


def _candidates_table(candidates: list[Candidate], best: Candidate, n: int, goal: TuneObjective) -> Table:
    t = Table(title=f"candidates at N={n}, each with its own tuned B; chosen by {goal} throughput")
    for col in ("candidate", "GPUs", "GPU ids", "B", "sim tok/s", "per GPU", "Markov tok/s", ""):
        t.add_column(col, justify="left" if col in ("candidate", "GPU ids") else "right")
    for c in candidates:
        # GPU ids per model in model order, e.g. "0 + 0,1 tp2": the small on GPU 0, the large over 0 and 1
        where = " + ".join(",".join(map(str, m.gpus)) + (f" tp{m.tp}" if m.tp > 1 else "") for m in c.deployment.models)
        p = c.point(n)
        mark = ", ".join(x for x in ("chosen" if c is best else "", "est." if c.estimated else "") if x)
        t.add_row(c.label, str(c.gpus), where, _b(p.best), f"{c.throughput(n):,.0f}", f"{c.per_gpu(n):,.0f}",
                  f"{p.prediction.throughput:,.0f}", mark)  # fmt: skip
    return t


def _choice_notes(candidates: list[Candidate], best: Candidate, n: int, goal: TuneObjective, num_gpus: int,
                  placements: bool, splits: bool) -> dict:  # fmt: skip
    """What the choice among candidates was, for the config's notes (nothing when there was one candidate)."""
    out: dict = {}
    if splits:
        at = {f"{c.split[0]}/{c.split[1]}": round(c.throughput(n), 1) for c in candidates if c.split is not None}
        out["sm_splits_sim_tok_s_at_N"] = {str(n): at}
    if placements:
        out["placements"] = {
            "num_gpus": num_gpus,
            "objective": str(goal),
            "compared_at_N": n,
            "chosen": best.label,
            "candidates": [_candidate_note(c, n) for c in candidates],
        }
    return out


def _candidate_note(c: Candidate, n: int) -> dict:
    return {
        "candidate": c.label,
        "gpus": c.gpus,
        "tp": [m.tp for m in c.deployment.models],
        "gpu_ids": [list(m.gpus) for m in c.deployment.models],
        "B": list(c.point(n).best),
        "sim_tok_s": round(c.throughput(n), 1),
        "sim_tok_s_per_gpu": round(c.per_gpu(n), 1),
        "estimated": c.estimated,
    }


def _splits(text: str) -> list[tuple[int, int]]:
    out = []
    for item in parse_list(text, str, "--sm-splits"):
        a, sep, b = item.partition("/")
        if not sep or not a.isdigit() or not b.isdigit() or not (1 <= int(a) <= 100 and 1 <= int(b) <= 100):
            raise ValueError(f"--sm-splits: {item!r} is not SMALL/LARGE percentages, e.g. 40/60")
        out.append((int(a), int(b)))
    return out


def _b(b: tuple[int, ...]) -> str:
    return ",".join(map(str, b))
