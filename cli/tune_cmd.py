"""`trsim tune`: choose delayed-batching thresholds per concurrency and write a deployment config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenrouter.cli.common import parse_list
from tokenrouter.cli.options import DeploymentFlags, DryRun, MaxOutput, Seed, Workload, deployment_flags
from tokenrouter.cli.run_cmd import sim_config
from tokenrouter.sim.tune import tune_point


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
                "larger N runs a reduced search (coarser quantum, threshold grid, or B scaled from N/2) and says so.",
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
                         "the one whose tuned B simulates fastest at --split-n is written. Needs a profile that "
                         "measured the pair at each split."),
        ] = None,
        split_n: Annotated[int, typer.Option(help="Concurrency at which SM splits are compared.")] = 8,
        dry_run: DryRun = False,
    ) -> None:
        """For each N: B* from the Markov model, the top candidates checked in the simulator; the measured best
        goes into the config's B(N) table, which `tr serve --config` follows as live concurrency changes.
        The deployment tuned is `--config` (or the default pair) with the flags applied; its policy becomes
        delayed."""
        ns = sorted(set(parse_list(concurrency, int, "--concurrency")))
        if ns[0] < 1:
            raise ValueError("--concurrency values must be >= 1")
        deploy.overrides.policy = "delayed"
        deploy.overrides.thresholds = None
        deploy.thresholds_auto = False
        if dry_run:
            typer.echo(deploy.resolve().to_yaml().rstrip())
            return
        console = Console(stderr=True)
        splits = _splits(sm_splits) if sm_splits else [None]
        if sm_splits and split_n not in ns:
            raise ValueError(f"--split-n {split_n} must be one of --concurrency {concurrency}")
        by_split: dict[tuple[int, int] | None, tuple[list, object]] = {}
        cols = (TextColumn("tune {task.fields[split]} N={task.fields[n]}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn())  # fmt: skip
        with Progress(*cols, console=console) as bar:
            task = bar.add_task("tune", total=len(ns) * len(splits), n=ns[0], split="")
            for split in splits:
                if split is not None:
                    deploy.overrides.sm_percent = list(split)
                points, cfg = [], None
                for n in ns:
                    bar.update(task, n=n, split=f"SM {split[0]}/{split[1]}" if split else "")
                    reqs = num_requests or max(32, 4 * n)
                    cfg, _ = sim_config(deploy, concurrency=n, workload=workload, num_requests=reqs, seed=seed,
                                        max_output=max_output)  # fmt: skip
                    points.append(tune_point(cfg, n, top=top))
                    bar.advance(task)
                by_split[split] = (points, cfg)
        ref_n = split_n if sm_splits else ns[-1]

        def at_ref(sp: tuple[int, int] | None) -> float:
            return next(p.best_throughput for p in by_split[sp][0] if p.concurrency == ref_n)

        best_split = max(by_split, key=at_ref)
        points, cfg = by_split[best_split]
        assert cfg is not None
        dep = cfg.deployment
        dep.policy.table = {p.concurrency: list(p.best) for p in points}
        dep.policy.thresholds = list(points[-1].best)
        if sm_splits:
            at = {f"{sp[0]}/{sp[1]}": round(next(p.best_throughput for p in pts if p.concurrency == split_n), 1)
                  for sp, (pts, _) in by_split.items() if sp is not None}  # fmt: skip
            Console().print(f"SM split at N={split_n}, tuned B, simulated tok/s: "
                            + ", ".join(f"{k} {v:,.0f}" for k, v in at.items())
                            + f"; chosen {best_split[0]}/{best_split[1]}")  # fmt: skip
        dep.notes = {
            "tuned_by": "trsim tune",
            "hop_rate": dep.router.hop_rate,
            "workload": workload,
            "profile": dep.profile,
            **({"sm_splits_sim_tok_s_at_N": {str(split_n): at}} if sm_splits else {}),
            "points": [
                {
                    "N": p.concurrency,
                    "markov_B": list(p.prediction.thresholds),
                    "markov_tok_s": round(p.prediction.throughput, 1),
                    "chosen_B": list(p.best),
                    "sim_tok_s": round(p.best_throughput, 1),
                }
                for p in points
            ],
        }
        dep.save(out)
        names = " + ".join(m.name for m in dep.models)
        t = Table(title=f"trsim tune: {names}, {dep.router.name} hop rate {dep.router.hop_rate}, "
                  f"{dep.placement.mode}, {workload}")  # fmt: skip
        for col in ("N", "Markov B*", "Markov tok/s", "sim tok/s @B*", "chosen B", "sim tok/s", "eager tok/s"):
            t.add_column(col, justify="right")
        eager = (1,) * len(dep.models)
        for p in points:
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
        for p in points:
            if p.prediction.note:
                Console().print(f"N={p.concurrency}: {p.prediction.note}")
        Console().print(f"wrote {out}")


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
