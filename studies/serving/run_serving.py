"""Live serving study: `tokenrouter serve` on a GPU with the config `trsim tune` wrote, `tokenrouter bench` at
several concurrencies for several policies, each cell with the simulator's prediction beside it (`--sim`).

    python studies/serving/run_serving.py --config studies/serving/serve.yaml --out OUT [--deadline 540]

One server per (policy, overlap); cells ordered so the most important ones (N = 8) run first, and no new cell
starts past `--deadline` seconds. Writes OUT/serving.csv (one row per cell), OUT/serving.json (the bench JSON of
every cell, the /metrics deltas, start-up and shutdown times), OUT/serve_logs.txt (the servers' log tails).
Per cell, the small model's mean step time and batch size in the serving loop come from /metrics deltas.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd

from tokenrouter.bench.server import TR, scrape, start_server, stop_server

KEYS = ("output_throughput_tok_s", "steady_output_throughput_tok_s", "ttft_ms_mean", "tpot_ms_mean",
        "e2e_ms_mean", "hops_per_request", "requests_completed", "requests_failed")  # fmt: skip


def small_loop(before: dict[str, float], after: dict[str, float], model: str) -> dict[str, float | None]:
    """Mean step time (ms) and rows per step of `model` between two /metrics snapshots."""

    def d(prefix: str) -> float | None:
        keys = [k for k in after if k.startswith(prefix) and f'model="{model}"' in k]
        return after[keys[0]] - before.get(keys[0], 0.0) if keys else None

    steps, secs, rows = d("tokenrouter_steps"), d("tokenrouter_step_seconds"), d("tokenrouter_step_rows")
    out: dict[str, float | None] = {"step_ms": None, "rows_per_step": None}
    if steps:
        out["step_ms"] = None if secs is None else 1e3 * secs / steps
        out["rows_per_step"] = None if rows is None else rows / steps
    # Back-to-back steps: the loop's period per step against the GPU time of the same steps (CUDA events).
    n, loop, gpu, lrows = (d("tokenrouter_loop_steps"), d("tokenrouter_loop_seconds"),
                           d("tokenrouter_loop_gpu_seconds"), d("tokenrouter_loop_rows"))  # fmt: skip
    out.update(loop_steps=n, loop_ms=None, loop_gpu_ms=None, loop_rows_per_step=None, overhead_frac=None)
    if n:
        out.update(loop_ms=1e3 * loop / n, loop_gpu_ms=1e3 * gpu / n, loop_rows_per_step=lrows / n)
        if gpu:
            out["overhead_frac"] = loop / gpu - 1.0
    return out


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ns", default="8,1,4,16")
    p.add_argument("--policies", default="delayed,step-sync,eager")
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--workload", default="low-effort")
    p.add_argument("--deadline", type=float, default=540.0)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run with the tiny models")
    p.add_argument("--sweep", default="", help="delayed thresholds to try live at --sweep-n, e.g. '1,3;2,4' "
                   "(one server each, after the main grid)")  # fmt: skip
    p.add_argument("--sweep-n", type=int, default=8)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    small = large = None
    rows, raw, logs = [], {"servers": {}}, []
    ns_all = [int(n) for n in a.ns.split(",")]
    runs: list[tuple[str, bool, list[int], str | None]] = [(pol, True, ns_all, None) for pol in a.policies.split(",")]
    runs.append(("delayed", False, [n for n in ns_all if n in (8, 16)] or ns_all[:1], None))  # what overlap saves
    runs += [("delayed", True, [a.sweep_n], th) for th in a.sweep.split(";") if th]

    def save() -> None:  # after every cell: a run cut by its time limit keeps what it measured
        pd.DataFrame(rows).to_csv(out / "serving.csv", index=False)
        (out / "serving.json").write_text(json.dumps(raw, indent=1, default=str))
        (out / "serve_logs.txt").write_text("\n".join(logs))

    for policy, overlap, ns, th in runs:
        tag = f"{policy}{'' if overlap else '-no-overlap'}{f'-B{th}' if th else ''}"
        if time.monotonic() - t_start > a.deadline - 90:
            print(f"skip {tag}: deadline")
            continue
        log = out / f"serve_{tag}.log"
        args = ["--config", a.config, "--device", a.device, "--policy", policy]
        args += (["--thresholds", th] if th else []) + ([] if overlap else ["--no-overlap"])
        proc, url, up = start_server(args, a.port, log, timeout_s=300)
        raw["servers"][tag] = {"startup_s": up}
        if up is None:
            print(f"{tag}: server did not come up")
            logs.append(f"== {tag}\n" + log.read_text()[-4000:])
            continue
        print(f"{tag}: up in {up:.0f} s", flush=True)
        if small is None:
            small, large = httpx.get(url + "/v1/models").json()["data"][0]["id"].split("+")[:2]
        for n in ns:
            if time.monotonic() - t_start > a.deadline - 30:
                print(f"skip {tag} N={n}: deadline")
                continue
            before = scrape(url)
            jf = out / f"bench_{tag}_{n}.json"
            cmd = [*TR, "bench", "--url", url, "-n", str(n), "--num-requests", str(max(8, 3 * n)), "--workload",
                   a.workload, "--max-output", str(a.max_output), "--seed", "0", "--json", str(jf), "--sim",
                   "--config", a.config, "--policy", policy, "--overlap" if overlap else "--no-overlap"]  # fmt: skip
            if th:
                cmd += ["--thresholds", th]
            t0 = time.monotonic()
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            after = scrape(url)
            if res.returncode != 0 or not jf.exists():
                print(f"{tag} N={n}: bench failed: {(res.stderr or res.stdout)[-300:]}")
                continue
            rec = json.loads(jf.read_text())
            jf.unlink()
            loop = small_loop(before, after, small)
            big = small_loop(before, after, large)
            raw[f"{tag}/N={n}"] = {"bench": rec, "small_loop": loop, "large_loop": big, "wall_s": time.monotonic() - t0}
            row = {"policy": policy, "overlap": overlap, "thresholds": th or "tuned", "N": n,
                   **{k: rec.get(k) for k in KEYS},
                   "sim_output_throughput_tok_s": rec.get("sim_output_throughput_tok_s"),
                   "small_step_ms": loop["step_ms"], "small_rows_per_step": loop["rows_per_step"],
                   "small_loop_ms": loop["loop_ms"], "small_loop_gpu_ms": loop["loop_gpu_ms"],
                   "small_loop_rows": loop["loop_rows_per_step"], "small_loop_steps": loop["loop_steps"],
                   "small_overhead_frac": loop["overhead_frac"], "large_step_ms": big["step_ms"],
                   "large_rows_per_step": big["rows_per_step"], "large_loop_ms": big["loop_ms"],
                   "large_loop_gpu_ms": big["loop_gpu_ms"]}  # fmt: skip
            rows.append(row)
            save()
            print(
                f"{tag} N={n}: live {_f(row['output_throughput_tok_s'])} sim {_f(row['sim_output_throughput_tok_s'])}"
                f" tok/s; small loop {_f(loop['loop_ms'], 3)} ms/step vs GPU {_f(loop['loop_gpu_ms'], 3)} ms x "
                f"{_f(loop['loop_rows_per_step'], 2)} rows (overhead {_f(loop['overhead_frac'], 3)}); large "
                f"{_f(big['step_ms'], 2)} ms x {_f(big['rows_per_step'], 2)} rows",
                flush=True,
            )
        raw["servers"][tag]["shutdown_s"] = stop_server(proc, timeout_s=30)
        logs.append(f"== {tag}\n" + log.read_text()[-2000:])
        log.unlink()
        save()
    save()
    print(f"done in {time.monotonic() - t_start:.0f} s: {len(rows)} cells")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
