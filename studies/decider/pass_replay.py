"""Replay a served run's logged passes of one model alone on the GPU: back to back (as `tr calibrate` times its
grid), spaced by idle gaps, and in the run's own launch rhythm; with the SM clock and power sampled beside each
mode, and the calibration grid's own point on the same engine.

Why: at N = 64 the 32B's 450-500-token passes ran in 0.88-0.93 of the profile's alone price while the 0.6B ran
beside them (`pass_times.py`). Either the grid's shapes differ from serving's, or back-to-back passes run at
lower clocks than passes with idle time between them; this tells the two apart on one engine in one run.

    python3 studies/decider/pass_replay.py --config studies/serving/headline.yaml \
        --steps studies/decider/live-2026-12-03-n64-sweep --out OUT                 # one H200, ~3 min
    python3 studies/decider/pass_replay.py ... --device cpu --smoke                  # tiny pair on CPU

Writes OUT/pass_replay.json (per pass and mode: median GPU ms; per mode: SM clock and power) and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

from pass_times import alone_ms, read_steps  # studies/decider (run from the repository root or this folder)


class ClockSampler:
    """`nvidia-smi` every 50 ms in a thread; each line stamped with the host's monotonic clock on arrival."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (t, sm MHz, W)
        try:
            query = ["--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
            cmd = ["nvidia-smi", *query, "-i", "0", "-lms", "50"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                sm, w = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), sm, w))

    def window(self, t0: float, t1: float) -> dict:
        s = [(sm, w) for t, sm, w in self.samples if t0 <= t <= t1]
        if not s:
            return {}
        return {"sm_mhz": round(statistics.median(x for x, _ in s)), "sm_mhz_min": min(x for x, _ in s),
                "watts": round(statistics.median(w for _, w in s)), "samples": len(s)}  # fmt: skip

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def steady(steps: list[dict], mark: dict, model: int, tokens: tuple[int, int]) -> list[dict]:
    """`model`'s passes of `tokens[0]..tokens[1]` tokens in the middle 80% of one B's load (no prompt prefills)."""
    t0, t1 = mark["t0"], mark["t1"]
    t0, t1 = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
    lo, hi = tokens
    return [s for s in steps if s["model"] == model and t0 <= s["launch"] <= t1 and lo <= s["tokens"] <= hi]


def pick(steps: list[dict], marks: list[dict], model: int, per_b: int, tokens: tuple[int, int]) -> dict[str, list]:
    """Up to `per_b` of `model`'s steady passes from each B's load, evenly spread over it."""
    out = {}
    for mk in marks:
        if part := steady(steps, mk, model, tokens):
            stride = max(1, len(part) // per_b)
            out[",".join(map(str, mk["B"]))] = part[::stride][:per_b]
    return out


class Replayer:
    def __init__(self, engine) -> None:
        self.eng = engine
        engine.timing = engine.device.type == "cuda"
        self._n = 0

    def batch(self, row_tokens: list[int], row_ctx: list[int]):
        from tokenrouter.core.batch import Batch, BatchRow
        from tokenrouter.core.request import Request

        rows, vocab = [], self.eng.spec.vocab_size
        for t, c in zip(row_tokens, row_ctx, strict=True):
            self._n += 1
            req = Request(f"rp{self._n}", [(31 * j + self._n) % vocab for j in range(c)], c)
            if not self.eng.kv_pool.grow(req.pages, c):
                raise RuntimeError(f"KV pool too small for {len(row_tokens)} rows")
            rows.append(BatchRow(req, c - t, t))
        return Batch(1, 0, rows)

    def release(self, batch) -> None:
        for r in batch.rows:
            self.eng.kv_pool.release(r.req.pages)

    def step_ms(self, batch) -> tuple[float, str]:
        t0 = time.perf_counter()
        h = self.eng.step(batch)
        h.result()
        wall = (time.perf_counter() - t0) * 1e3
        ms = h.gpu_start.elapsed_time(h.gpu_end) if getattr(h, "gpu_start", None) is not None else wall
        path = (f"varlen:{h.varlen_bucket}" if getattr(h, "varlen_bucket", None) is not None
                else f"decode:{h.graph_bucket}" if h.graph_bucket is not None else "eager")  # fmt: skip
        return ms, path


def run(a: argparse.Namespace) -> dict:
    from tokenrouter.calibration.cost import CostModel
    from tokenrouter.calibration.profiler.pass_timing import row_tokens
    from tokenrouter.core.config import load_config
    from tokenrouter.runtime.build import SubserverSpec, build_part
    from tokenrouter.runtime.launcher import gpu_memory_gb

    cfg = load_config(a.config)
    if a.smoke:
        from dataclasses import replace

        tiny = [replace(m, name=n) for m, n in zip(cfg.models, ("tiny-small", "tiny-large"), strict=True)]
        cfg = replace(cfg, models=tiny)
    meta = json.loads((a.steps / "marks.json").read_text())
    logged = read_steps(a.steps)
    chosen = pick(logged, meta["marks"], a.model, a.per_b, (a.min_tokens, a.max_tokens))
    run_of = steady(logged, meta["marks"][0], a.model, (1, 10**9))  # every pass, for the rhythm
    run_of = run_of[len(run_of) // 2 :][: 3 * a.per_b]
    cost = CostModel(cfg.profile, models=[m.name for m in load_config(a.config).models]).for_model(a.model)
    rule = cfg.models[a.model].graph_rule()
    memory = gpu_memory_gb(0) if a.device == "cuda" else 1.0
    spec = SubserverSpec(a.model, cfg, None, a.device, memory)  # as the live subserver built it (same memory share)
    _, _, eng = build_part(spec, None)
    rp = Replayer(eng)
    clocks = ClockSampler() if a.device == "cuda" else None
    modes: dict[str, dict] = {}
    passes: list[dict] = []

    def mode(name: str, fn) -> None:
        t0 = time.monotonic()
        try:
            fn()
        except Exception as e:  # keep what the other modes measured
            modes[f"{name}_error"] = repr(e)
        modes[name] = {"s": round(time.monotonic() - t0, 2), **(clocks.window(t0, time.monotonic()) if clocks else {})}

    def b2b() -> None:  # each pass a.reps times back to back, as the grid is timed
        for b, part in chosen.items():
            for s in part:
                batch = rp.batch(s["row_tokens"], s["row_ctx"])
                for _ in range(2):
                    rp.step_ms(batch)
                times = [rp.step_ms(batch) for _ in range(a.reps)]
                rp.release(batch)
                passes.append({"B": b, "step": s["step"], "tokens": s["tokens"], "rows": s["rows"],
                               "live_ms": round(s["gpu_ms"], 3), "price_ms": round(alone_ms(cost, rule, s), 3),
                               "b2b_ms": round(statistics.median(t for t, _ in times), 3), "path": times[-1][1],
                               "live_path": s.get("varlen") or s.get("graph") or "eager"})  # fmt: skip

    def spaced() -> None:  # the same passes with `gap` ms of idle GPU before each
        i = 0
        for part in chosen.values():
            for s in part:
                batch = rp.batch(s["row_tokens"], s["row_ctx"])
                rp.step_ms(batch)
                times = []
                for _ in range(a.reps):
                    time.sleep(a.gap_ms / 1e3)
                    times.append(rp.step_ms(batch)[0])
                rp.release(batch)
                passes[i]["spaced_ms"] = round(statistics.median(times), 3)
                i += 1

    def rhythm() -> None:  # the first B's passes in log order at the logged offsets (no small model beside)
        b, part = ",".join(map(str, meta["marks"][0]["B"])), run_of
        t_log0, t0 = part[0]["launch"], time.monotonic()
        got = []
        for s in part:  # each batch built just before its launch: the pool does not hold all of them at once
            batch = rp.batch(s["row_tokens"], s["row_ctx"])
            wait = (s["launch"] - t_log0) - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait)
            got.append(rp.step_ms(batch)[0])
            rp.release(batch)
        modes["rhythm_B"] = b
        modes["rhythm_ms"] = [round(x, 3) for x in got]

    grid = {}

    def grid_points() -> None:  # the calibration grid's mix on this engine: rows of 12 tokens at context 1024
        for tokens in a.grid_tokens:
            rows = row_tokens(tokens, "returns")
            batch = rp.batch(rows, [max(a.grid_ctx, r) for r in rows])
            for _ in range(2):
                rp.step_ms(batch)
            times = [rp.step_ms(batch) for _ in range(a.reps)]
            rp.release(batch)
            grid[tokens] = {"ms": round(statistics.median(t for t, _ in times), 3), "path": times[-1][1]}

    sweep: list[dict] = []

    def gap_sweep() -> None:  # each shape at each idle gap, two rounds in turn: step time and clocks against the gap
        for rnd in range(2):
            for shape in a.gap_sweep:
                rows, tokens, ctx = shape
                batch = rp.batch([tokens] * rows, [max(ctx, tokens)] * rows)
                for gap in a.gaps:
                    for _ in range(3):  # settle at this duty cycle first
                        time.sleep(gap / 1e3)
                        rp.step_ms(batch)
                    t0, times = time.monotonic(), []
                    for _ in range(a.reps):
                        time.sleep(gap / 1e3)
                        times.append(rp.step_ms(batch)[0])
                    ms = statistics.median(times)
                    sweep.append({"round": rnd, "rows": rows, "tokens": tokens, "ctx": ctx, "gap_ms": gap,
                                  "ms": round(ms, 3), "duty": round(ms / (ms + gap), 3),
                                  **(clocks.window(t0, time.monotonic()) if clocks else {})})  # fmt: skip
                rp.release(batch)

    try:
        if a.gap_sweep:
            mode("gap_sweep", gap_sweep)
        else:
            mode("back_to_back", b2b)
            mode("spaced", spaced)
            mode("rhythm", rhythm)
            mode("grid", grid_points)
    finally:
        if clocks:
            clocks.close()
        eng.close()
    return {"config": str(a.config), "steps": str(a.steps), "model": a.model, "reps": a.reps, "gap_ms": a.gap_ms,
            "modes": modes, "grid_returns_ctx": a.grid_ctx, "grid": grid, "passes": passes,
            "gap_sweep": sweep}  # fmt: skip


def summary(res: dict) -> list[str]:
    if res["gap_sweep"]:
        lines = ["rows x tokens @ctx   gap ms  pass ms (round 0 / 1)  duty   SM MHz  W"]
        first = [r for r in res["gap_sweep"] if r["round"] == 0]
        for r in first:
            again = next(x for x in res["gap_sweep"] if x["round"] == 1 and x["gap_ms"] == r["gap_ms"]
                         and (x["rows"], x["tokens"], x["ctx"]) == (r["rows"], r["tokens"], r["ctx"]))  # fmt: skip
            lines.append(f"{r['rows']:3} x {r['tokens']:3} @{r['ctx']:5}  {r['gap_ms']:6.0f}  {r['ms']:7.2f} / "
                         f"{again['ms']:7.2f}  {r['duty']:.2f}  {r.get('sm_mhz', '-'):>6}  "
                         f"{r.get('watts', '-')}")  # fmt: skip
        return lines
    lines = ["B      n  tokens  live   price  b2b    spaced  live/b2b spaced/b2b price/b2b"]
    by_b: dict[str, list[dict]] = {}
    for p in res["passes"]:
        by_b.setdefault(p["B"], []).append(p)
    for b, ps in by_b.items():

        def m(k: str, ps=ps) -> float:
            return statistics.mean(p[k] for p in ps if k in p)

        b2b = m("b2b_ms")
        lines.append(f"{b:6} {len(ps):2} {m('tokens'):6.0f} {m('live_ms'):6.1f} {m('price_ms'):6.1f} {b2b:6.1f} "
                     f"{m('spaced_ms'):6.1f}  {m('live_ms') / b2b:.3f}    {m('spaced_ms') / b2b:.3f}     "
                     f"{m('price_ms') / b2b:.3f}")  # fmt: skip
    for k in ("back_to_back", "spaced", "rhythm", "grid"):
        lines.append(f"{k}: {res['modes'].get(k)}")
    r = res["modes"].get("rhythm_ms") or []
    if r:
        lines.append(f"rhythm ({res['modes']['rhythm_B']}): median {statistics.median(r):.1f} ms over {len(r)} passes")
    lines.append(f"grid (returns, ctx {res['grid_returns_ctx']}): {res['grid']}")
    return lines


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        rows, rest = part.split("x")
        tokens, ctx = rest.split("@")
        out.append((int(rows), int(tokens), int(ctx)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--steps", type=Path, required=True, help="a pass_times run folder (marks.json + step logs)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", type=int, default=1)
    p.add_argument("--per-b", type=int, default=12, help="passes replayed per B of the run")
    p.add_argument("--min-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=1024, help="leave out prompt prefills (2,048-token chunks)")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--gap-ms", type=float, default=30.0)
    p.add_argument("--grid-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[128, 256, 384, 512])
    p.add_argument("--grid-ctx", type=int, default=1024)
    p.add_argument(
        "--gap-sweep",
        type=parse_shapes,
        default=[],
        help="only time these shapes, 'ROWSxTOKENS@CTX,...', at each of --gaps (idle ms before each pass)",
    )
    p.add_argument("--gaps", type=lambda s: [float(x) for x in s.split(",")], default=[0, 2, 5, 10, 20, 40, 80])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="the tiny pair (CPU)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    res = run(a)
    (a.out / "pass_replay.json").write_text(json.dumps(res, indent=1))
    print("\n".join(summary(res)))


if __name__ == "__main__":
    main()
