"""Raw calibration results (the partial file) -> a measured `Profile`. No torch: `tr calibrate --refit` redoes a
fit on a laptop.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime
from typing import Any

import msgspec
import numpy as np
from scipy.optimize import nnls

from tokenrouter.calibration.fit import fit_passes
from tokenrouter.calibration.interference import interp1, pair_interference
from tokenrouter.calibration.measured import (
    CoRunGrid,
    CoRunShare,
    FitError,
    HostCosts,
    MeasuredPasses,
    PassPoint,
    PassTable,
    RouterCost,
    RuntimeInfo,
)
from tokenrouter.calibration.profile import (
    SCHEMA_VERSION,
    GpuInfo,
    LinkInfo,
    ModelProfile,
    MpsInfo,
    Profile,
    StdServingInfo,
    StepCoeffs,
    StepModes,
)
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.models import load_spec

PREPARE_MARGIN_MS = 1.0  # runtime.build.SubserverSpec.prepare_margin_ms: the runtime's default


def _points(recs: list[dict], kind: str, held: bool, by: str = "ran") -> list[PassPoint]:
    fields = PassPoint.__struct_fields__
    return [PassPoint(**{f: r[f] for f in fields}) for r in recs if r.get(by) == kind and r["held_out"] == held]


def fit_model_passes(raw: dict[str, Any]) -> MeasuredPasses:
    """The three pass tables of one model from its measured points ("points": id -> record; "info")."""
    info = raw["info"]
    recs = list(raw["points"].values())
    tables: dict[str, PassTable] = {}
    knots = {"decode": info.get("decode_buckets") or None, "varlen": info.get("varlen_buckets") or None}
    for kind in ("decode", "varlen", "eager"):
        pts, held = _points(recs, kind, False), _points(recs, kind, True)
        if pts:
            graph = kind != "eager"
            tables[kind] = fit_passes(pts, held, round_up=graph, knots=knots.get(kind) if graph else None)
    if "decode" not in tables:  # no decode graphs ran (CPU, graphs off): decode points priced as they ran
        pts, held = _points(recs, "decode", False, "intended"), _points(recs, "decode", True, "intended")
        tables["decode"] = fit_passes(pts, held, round_up=False)
    if "eager" not in tables:
        raise ValueError(f"no eager pass was measured for {raw.get('model', '?')}")
    return MeasuredPasses(
        decode=tables["decode"], varlen=tables.get("varlen"), eager=tables["eager"],
        max_row_tokens=int(info.get("max_row_tokens", 8)), varlen_max_pad=info.get("varlen_max_pad"),
        varlen_max_long_rows=int(info.get("varlen_long_rows", 8)),
    )  # fmt: skip


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Non-negative c0 + c1 * x through the points."""
    if len(xs) == 1:
        return max(0.0, ys[0]), 0.0
    a = np.asarray([[1.0, x] for x in xs])
    coef, _ = nnls(a, np.asarray(ys, float))
    return float(coef[0]), float(coef[1])


def host_costs(raw: dict[str, Any], served: list[dict[str, Any]] | None = None,
               gate_ms: float = 0.0) -> HostCosts | None:  # fmt: skip
    """The loop's host time per step without overlap and what it adds with overlap, as a fraction of the GPU time.
    Without overlap: the bare loop's line; with the real server's `serving_gap` records (less the coordinator's
    round trips `gate_ms`), their level, steps-weighted, at the bare loop's slope per row when the bare loop has
    two row counts. The served steps hold the server's per-step costs, but a server runs few steps of more than
    one row under step-sync (7 and 8 rows, 93 steps, in the 2026-12-02 run), which do not fix a slope that holds
    at 40-60 rows: theirs (0.031 ms/row) charged 1.75 ms at 40 rows where the bare loop's timers give 0.006."""
    recs = list(raw.get("host", {}).values())
    sync = [r for r in recs if not r["overlap"]]
    if not sync and not served:
        return None

    def host_ms(r: dict) -> float:
        if r.get("gpu_ms"):
            return max(0.0, r["loop_ms"] - r["gpu_ms"])
        return r["step_host_ms"] + r["schedule_ms"] + r["complete_ms"]

    if served:
        inside = _line([r["rows"] for r in sync], [r["step_host_ms"] for r in sync]) if sync else (0.0, 0.0)

        def idle_ms(r: dict) -> float:
            if "idle_ms" in r:
                return r["idle_ms"]
            return r["gap_ms"] + inside[0] + inside[1] * r["rows"]

        xs, ys = [r["rows"] for r in served], [max(0.0, idle_ms(r) - gate_ms) for r in served]
        if len({r["rows"] for r in sync}) > 1:
            row = _line([r["rows"] for r in sync], [host_ms(r) for r in sync])[1]
            w = [r.get("steps", 1) for r in served]
            c0 = max(0.0, sum(wi * (y - row * x) for wi, x, y in zip(w, xs, ys, strict=True)) / sum(w))
        else:
            c0, row = _line(xs, ys)
    else:
        c0, row = _line([r["rows"] for r in sync], [host_ms(r) for r in sync])
    fracs = [max(0.0, r["loop_ms"] / r["gpu_ms"] - 1.0) for r in recs if r["overlap"] and r.get("gpu_ms")]
    return HostCosts(c0_ms=round(c0, 6), row_ms=round(row, 6),
                     overlap_frac=round(statistics.median(fracs), 6) if fracs else 0.0)  # fmt: skip


def router_costs(raw: dict[str, Any]) -> dict[str, RouterCost]:
    out = {}
    for name, per_b in raw.get("routers", {}).items():
        bs = sorted(per_b, key=int)
        c0, row = _line([float(b) for b in bs], [max(0.0, per_b[b]["with_ms"] - per_b[b]["without_ms"]) for b in bs])
        out[name] = RouterCost(c0_ms=round(c0, 6), row_ms=round(row, 6))
    return out


def arrangement_grid(raw: dict[str, Any], name: str, a: str, b: str, mps: CoRunGrid | None) -> CoRunGrid:
    """A one-process arrangement's grid (one split, shares 100); references from the MPS grid's 100/100 when the
    pair has one (the models alone without any arrangement), else the arrangement's own alone times."""
    ba, bb = raw["batches_a"], raw["batches_b"]
    share = _share(raw, ba, bb)
    same = mps is not None and mps.batches_a == list(ba) and mps.batches_b == list(bb)
    grid = CoRunGrid(
        arrangement=name, detail={k: int(v) for k, v in raw.get("detail", {}).items()}, model_a=a, model_b=b,
        context=int(raw["context"]), batches_a=list(ba), batches_b=list(bb),
        reference_a_ms=list(mps.reference_a_ms) if same else share.alone_a_ms,
        reference_b_ms=list(mps.reference_b_ms) if same else share.alone_b_ms, shares=[share],
    )  # fmt: skip
    return _with_errors(grid, [("100-100", raw)])


def corun_grid(pair_raw: dict[str, dict[str, Any]], a: str, b: str) -> CoRunGrid:
    """One pair's MPS grid from its splits ("corun/a|b/SA-SB" results); the 100/100 split gives the references."""
    splits = sorted(pair_raw.items(), key=lambda kv: kv[0] != "100-100")
    if not splits or splits[0][0] != "100-100":
        raise ValueError(f"co-location {a}|{b}: the 100/100 split (the reference) was not measured")
    first = splits[0][1]
    ba, bb = first["batches_a"], first["batches_b"]
    ref_a = [first["alone_a"][str(x)] for x in ba]
    ref_b = [first["alone_b"][str(x)] for x in bb]
    shares = [_share(r, ba, bb, *(int(x) for x in key.split("-"))) for key, r in splits]
    grid = CoRunGrid(model_a=a, model_b=b, context=int(first["context"]), batches_a=list(ba), batches_b=list(bb),
                     reference_a_ms=ref_a, reference_b_ms=ref_b, shares=shares)  # fmt: skip
    return _with_errors(grid, splits)


def _with_errors(grid: CoRunGrid, splits: list[tuple[str, dict[str, Any]]]) -> CoRunGrid:
    """Held-out co-run cells against the interpolated grid: relative error of the co-run time."""
    rel: list[float] = []
    for key, r in splits:
        sa, sb = (int(x) for x in key.split("-"))
        fa = pair_interference(grid, grid.model_a, sa, sb)
        fb = pair_interference(grid, grid.model_b, sb, sa)
        for cell, got in r.get("held", {}).items():
            x, y = (int(v) for v in cell.split(","))
            ref_a = _interp_ref(grid.batches_a, grid.reference_a_ms, x)
            ref_b = _interp_ref(grid.batches_b, grid.reference_b_ms, y)
            rel.append(abs(fa.factor(x, y) * ref_a - got["a"]) / got["a"])
            rel.append(abs(fb.factor(y, x) * ref_b - got["b"]) / got["b"])
    errors = {"interp": FitError(median=statistics.median(rel), max=max(rel), points=len(rel))} if rel else {}
    return msgspec.structs.replace(grid, errors=errors)


def _share(raw: dict[str, Any], ba: list[int], bb: list[int], share_a: int = 100, share_b: int = 100) -> CoRunShare:
    """One split's step times (alone, and co-run at every pair of batch sizes) from its raw results."""
    return CoRunShare(
        share_a=share_a, share_b=share_b, alone_a_ms=[raw["alone_a"][str(x)] for x in ba],
        alone_b_ms=[raw["alone_b"][str(x)] for x in bb],
        corun_a_ms=[[raw["corun"][f"{x},{y}"]["a"] for y in bb] for x in ba],
        corun_b_ms=[[raw["corun"][f"{x},{y}"]["b"] for y in bb] for x in ba],
    )  # fmt: skip


def _interp_ref(bs: list[int], ms: list[float], x: int) -> float:
    return interp1([math.log2(max(1, v)) for v in bs], ms, math.log2(max(1, x)))


def runtime_info(rt: dict[str, Any]) -> RuntimeInfo | None:
    if not rt.get("complete"):
        return None
    return RuntimeInfo(ipc_ms=rt["ipc_ms"], tcp_ms=rt["tcp_ms"], gate_rtt_ms=rt["gate_rtt_ms"],
                       gate_rtts_per_step=rt["gate_rtts_per_step"], prepare_margin_ms=PREPARE_MARGIN_MS)  # fmt: skip


def serving_gaps(res: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Model name -> its serving-loop gap records from every finished `serving/` task (hand-offs' idle times stay
    out: under step-sync they pay two wake-ups that eager serving does not)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for task, raw in sorted(res.items()):
        if task.startswith("serving/") and raw.get("complete"):
            for name, recs in raw.get("gaps", {}).items():
                out.setdefault(name, []).extend(recs)
    return out


def assemble(partial: dict[str, Any]) -> Profile:
    """A measured Profile from a calibration's results (see `calibration.profiler.run` for the layout)."""
    res = partial["results"]
    env = partial.get("env", {})
    analytic = load_profile("h200-analytic")
    runtime = runtime_info(res.get("runtime", {}))
    served = serving_gaps(res)
    gate_ms = runtime.gate_rtts_per_step.get("step-sync", 0.0) * runtime.gate_rtt_ms if runtime else 0.0
    models: dict[str, ModelProfile] = {}
    for task, raw in res.items():
        if not task.startswith("model/") or not raw.get("complete"):
            continue
        name = task.split("/", 1)[1]
        spec = load_spec(name)
        passes = fit_model_passes(raw)
        dec, eag = passes.decode, passes.eager
        step = StepModes(
            graph=StepCoeffs(c0=dec.linear_c0, c_row=dec.linear_c_row, c_ctx=dec.linear_c_ctx, c_tok=dec.linear_c_tok,
                             c_ext=dec.linear_c_ext),
            eager=StepCoeffs(c0=eag.linear_c0, c_row=eag.linear_c_row, c_ctx=eag.linear_c_ctx, c_tok=eag.linear_c_tok,
                             c_ext=eag.linear_c_ext),
        )  # fmt: skip
        models[spec.name] = ModelProfile(
            weight_bytes=spec.weight_bytes, kv_bytes_per_token=spec.kv_bytes_per_token, step=step, passes=passes,
            host=host_costs(raw, served.get(spec.name), gate_ms), routers=router_costs(raw),
        )  # fmt: skip
    if not models:
        raise ValueError("no model finished calibrating: nothing to write yet (resume the run)")
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for task, raw in res.items():
        if task.startswith("corun/") and raw.get("complete"):
            _, pair, split = task.split("/")
            a, b = pair.split("|")
            pairs.setdefault((a, b), {})[split] = raw
    colocation = [corun_grid(v, a, b) for (a, b), v in sorted(pairs.items()) if a in models and b in models]
    mps_of = {(g.model_a, g.model_b): g for g in colocation}
    for task, raw in sorted(res.items()):
        if task.startswith("arrangement/") and raw.get("complete"):
            _, pair, name = task.split("/")
            a, b = pair.split("|")
            colocation.append(arrangement_grid(raw, name, a, b, mps_of.get((a, b))))
    entry = next(iter(models.values()))
    sched_ms = entry.host.c0_ms + entry.host.row_ms if entry.host else analytic.sched_ms
    gpu = GpuInfo(name=env.get("gpu", "unknown"), mem_bw_gbs=float(env.get("copy_gbs") or analytic.gpu.mem_bw_gbs),
                  matmul_tflops=float(env.get("matmul_tflops") or analytic.gpu.matmul_tflops),
                  memory_gb=float(env.get("memory_gb") or analytic.gpu.memory_gb))  # fmt: skip
    on_cpu = partial.get("plan", {}).get("device") == "cpu"
    prof = Profile(
        schema_version=SCHEMA_VERSION, kind="measured", gpu=gpu, device="cpu" if on_cpu else msgspec.UNSET,
        created=partial.get("created") or datetime.now().isoformat(timespec="seconds"),
        source="tr calibrate: the engine's passes, loop and co-location measured on this GPU (dummy weights)",
        command=partial.get("command", ""), versions=dict(env.get("versions", {})), models=models,
        router_ms=0.0, sched_ms=round(sched_ms, 6),
        ipc_ms=runtime.ipc_ms if runtime else analytic.ipc_ms,
        link=LinkInfo(latency_ms=runtime.tcp_ms if runtime else analytic.link.latency_ms,
                      bandwidth_gbps=analytic.link.bandwidth_gbps),
        mps=MpsInfo(default_slowdown=analytic.mps.default_slowdown, pairs={}),
        std_serving=StdServingInfo(**env["std_serving"]) if "std_serving" in env else analytic.std_serving,
        kv_budget_gb=analytic.kv_budget_gb, runtime=runtime,
        colocation=colocation,
        notes={
            "not_measured": ("" if "std_serving" in env else "std_serving (the analytic profile's), ")
            + "link bandwidth, kv_budget_gb, and the MPS slowdown of pairs not in `colocation` (constant)",
            "failed": partial.get("failed", {}),
            "plan": partial.get("plan", {}),
        },
    )  # fmt: skip
    return Profile.from_json(prof.to_json(), source="<assembled profile>")


def merge(profiles: list[Profile]) -> Profile:
    """One profile from several measured on the same GPU (e.g. one calibration per call): models and co-location
    grids of later profiles win on a clash; runtime costs and provenance from the first that has them."""
    if not profiles:
        raise ValueError("nothing to merge")
    gpus = {p.gpu.name for p in profiles}
    if len(gpus) > 1:
        raise ValueError(f"profiles of different GPUs cannot be merged: {', '.join(sorted(gpus))}")
    if any(p.kind != "measured" for p in profiles):
        raise ValueError("only measured profiles are merged (an analytic profile is generated whole)")
    first = profiles[0]
    models: dict[str, ModelProfile] = {}
    grids: dict[tuple[str, str, str], CoRunGrid] = {}
    for p in profiles:
        models.update(p.models)
        for g in p.colocation:
            grids[(g.arrangement, g.model_a, g.model_b)] = g
    runtime = next((p.runtime for p in profiles if p.runtime is not None), None)
    out = msgspec.structs.replace(
        first, models=models, colocation=list(grids.values()), runtime=runtime,
        command=" && ".join(p.command for p in profiles if p.command),
        notes={**first.notes, "merged_from": [p.created for p in profiles]},
    )  # fmt: skip
    return Profile.from_json(out.to_json(), source="<merged profile>")
