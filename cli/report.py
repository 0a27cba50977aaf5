"""Human-readable output of a simulation: one rich table, plus JSON/CSV for machines."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import PolicyKind, format_b

if TYPE_CHECKING:  # the simulator is not imported by `tr serve` / `tr bench` (they print tables from here)
    from tokenrouter.sim.run import SimResult


def fmt_num(x: float, nd: int = 1, missing: str = "nan") -> str:
    return missing if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def result_record(res: SimResult) -> dict[str, Any]:
    """Flat dict of the run's settings and metrics (one CSV row / one JSON object)."""
    cfg, dep = res.config, res.config.deployment
    rec: dict[str, Any] = {
        "models": ",".join(m.name for m in dep.models), "router": dep.router.name, "hop_rate": dep.router.hop_rate,
        "policy": dep.policy_label, "thresholds": format_b(res.thresholds), "placement": dep.placement.mode,
        "tp": ",".join(str(m.tp) for m in dep.models), "gpus": ";".join(",".join(map(str, m.gpus)) for m in dep.models),
        "estimated": " | ".join(res.extra.get("estimated", [])), "workload": cfg.workload,
        "num_requests": cfg.num_requests, "concurrency": cfg.concurrency, "arrival_rate": cfg.arrival_rate,
        "seed": cfg.seed, "profile": dep.profile, "profile_kind": "analytic" if res.analytic else "measured",
        "cuda_graphs": all(m.cuda_graphs for m in dep.models), "overlap": dep.scheduler.overlap,
        "preemptions": res.preemptions, "wasted_rows": res.wasted_rows, "wall_s": round(res.wall_s, 3),
    }  # fmt: skip
    tune = res.extra.get("autotune")
    if tune is not None:
        rec["autotune_initial"] = format_b(tune["initial"])
        rec["autotune_changes"] = len(tune["changes"])
        rec["autotune_timeline"] = autotune_timeline(tune)
    rec.update(res.summary)
    return rec


def autotune_timeline(tune: dict[str, Any]) -> str:
    """`0:1,1;41.0:1,2;50.0:1,3`: the B in force from each time on (simulated seconds)."""
    parts = [f"0:{format_b(tune['initial'])}"]
    parts += [f"{c['at']:.1f}:{format_b(c['new'])}" for c in tune["changes"]]
    return ";".join(parts)


def metrics_table(s: dict[str, Any], names: list[str], title: str, missing: str = "nan") -> Table:
    """The metrics table of one run (simulated or live): throughput, latencies, hops, per-model figures; NaN
    (not observed) is written as `missing`."""
    t = Table(title=title, title_justify="left")
    for col, just in (("metric", "left"), ("mean", "right"), ("p50", "right"), ("p99", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    f = lambda x, nd=1: fmt_num(x, nd, missing)  # noqa: E731
    t.add_row("output throughput tok/s", f(s["output_throughput_tok_s"]), "", "")
    steady = s.get("steady_output_throughput_tok_s")
    if steady is not None:
        t.add_row("steady throughput tok/s", f(steady), "", "")
    gpus = s.get("gpus_used")
    if gpus is not None and gpus > 1:
        per = s["output_throughput_per_gpu_tok_s"]
        t.add_row(f"output throughput per GPU tok/s ({int(gpus)} GPUs)", f(per), "", "")
    t.add_row("requests completed", f"{int(s['requests_completed'])}", "", "")
    for key, label in (("ttft", "TTFT ms"), ("tpot", "TPOT ms"), ("itl", "ITL ms"), ("e2e", "E2E ms")):
        t.add_row(label, f(s[f"{key}_ms_mean"], 2), f(s[f"{key}_ms_p50"], 2), f(s[f"{key}_ms_p99"], 2))
    t.add_row("hops per request", f(s["hops_mean"], 2), "", "")
    for i, n in enumerate(names):
        if f"tokens_model{i}" not in s:
            continue
        t.add_row(f"{n} tokens (share)", f"{int(s[f'tokens_model{i}']):,} ({s[f'token_frac_model{i}']:.1%})", "", "")
        busy = s[f"busy_frac_model{i}"]
        t.add_row(f"{n} busy", missing if math.isnan(busy) else f"{busy:.1%}", "", "")
        t.add_row(f"{n} batch size", f(s[f"batch_mean_model{i}"], 2), f(s[f"batch_p50_model{i}"], 0),
                  f(s[f"batch_p99_model{i}"], 0))  # fmt: skip
    return t


def print_result(res: SimResult, console: Console | None = None) -> None:
    console = console or Console()
    s, dep = res.summary, res.config.deployment
    names = [m.name for m in dep.models]
    console.print(metrics_table(s, names, f"trsim run: {' + '.join(names)}"))
    rc = dep.router
    hops = f"replays {rc.trace or res.config.workload}" if rc.name == RouterName.TRACE else f"hop rate {rc.hop_rate}"
    ran = len(res.metrics.records)  # a workload file may hold fewer requests than asked for
    console.print(f"router {rc.name} ({hops}), policy {dep.policy_label}, thresholds B = "
                  f"{format_b(res.thresholds)}{_thr_note(res)}, placement {dep.placement.mode}, "
                  f"{res.config.workload} x {ran}, N = {res.config.concurrency}")  # fmt: skip
    end = run_end(res)
    for t, hop, n in res.extra.get("phases", []):
        what = ", ".join(x for x in (f"hop rate {hop}" if hop is not None else "", f"N = {n}" if n else "") if x)
        late = f" (not reached: the run ended at {end:.1f} s)" if t > end else ""
        console.print(f"phase at {t:.1f} s: {what}{late}")
    tune = res.extra.get("autotune")
    if tune is not None:
        console.print(f"autotune: B = {format_b(tune['initial'])} at the start; {len(tune['changes'])} "
                      f"change(s) in {tune['solves']} solve(s)")  # fmt: skip
        for c in tune["changes"]:
            est = c["estimates"]
            hop = "/".join("-" if p is None else f"{p:.3f}" for p in est["hop_prob"])
            what = "revert, measured" if c.get("revert") else "predicted"
            console.print(f"  {c['at']:8.1f} s: B {format_b(c['old'])} -> {format_b(c['new'])} "
                          f"({what} {c['predicted_gain']:+.1%}, {c['predicted_tok_s']:,.0f} tok/s; N = "
                          f"{est['concurrency']}, hop {hop})")  # fmt: skip
        for text in tune.get("notices", []):
            console.print(f"[yellow]{text}[/yellow]")
    console.print(gpu_line(res))
    for note in res.extra.get("estimated", []):
        console.print(f"[yellow]{note}[/yellow]")
    kv = ", ".join(f"{c:,}" for c in res.kv_tokens)
    overlap = "on" if dep.scheduler.overlap else "off"
    console.print(f"KV capacity per model: {kv} tokens; preemptions: {res.preemptions}; overlap {overlap} "
                  f"({res.wasted_rows:,} prepared rows wasted)")  # fmt: skip
    src = "ANALYTIC (bytes over bandwidth, not measured)" if res.analytic else "measured"
    if not res.analytic and res.config.cost is None:
        from tokenrouter.calibration.estimate import profile_label
        from tokenrouter.calibration.resolve import load_profile

        prof = load_profile(dep.profile)
        torch_v = prof.versions.get("torch", "?")
        src = f"MEASURED on {prof.gpu.name} by tr calibrate ({prof.created[:10]}, torch {torch_v}, dummy weights)"
        if prof.kind == "estimated":
            src = f"{profile_label(prof)} for {prof.gpu.name}"
        if res.extra.get("estimated"):
            src += ", with the ESTIMATES above"
    console.print(f"profile {dep.profile}: {src}; simulated {s['duration_s']:.2f} s in {res.wall_s:.2f} s wall; "
                  f"seed {res.config.seed}")  # fmt: skip


def run_end(res: SimResult) -> float:
    """When the last request finished (simulated s). The simulator applies a phase timed later anyway (its clock
    runs on to the phase), so what a run saw is what came before this."""
    return max((r.finish for r in res.metrics.completed() if r.finish is not None), default=0.0)


def gpu_line(res: SimResult) -> str:
    """`GPUs: 2 (qwen3-0.6b on GPU 0; qwen3-32b tp=2 on GPUs 0,1); per GPU 612.3 tok/s (steady 640.1)`."""
    s, dep = res.summary, res.config.deployment
    where = "; ".join(f"{m.name}{f' tp={m.tp}' if m.tp > 1 else ''} on GPU{'s' if len(m.gpus) > 1 else ''} "
                      f"{','.join(map(str, m.gpus))}" for m in dep.models)  # fmt: skip
    steady = s.get("steady_output_throughput_per_gpu_tok_s")
    tail = f" (steady {fmt_num(steady)})" if steady is not None else ""
    return f"GPUs: {int(s['gpus_used'])} ({where}); per GPU {fmt_num(s['output_throughput_per_gpu_tok_s'])} tok/s{tail}"


def _thr_note(res: SimResult) -> str:
    tune = res.extra.get("autotune")
    if tune is not None:
        start = format_b(tune["initial"])
        return f" at the end (autotune; at the start B = {start}{res.extra.get('thresholds_note', '')})"
    if res.config.deployment.policy.kind != PolicyKind.DELAYED:
        return f" ({res.config.deployment.policy_label}: no delay)"
    return res.extra.get("thresholds_note", "")


def write_json(rec: dict[str, Any], path: str) -> None:
    """`rec` as JSON (NaN, which is not JSON, as null) to `path`, or to stdout for '-'."""
    text = json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}, indent=2)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")
