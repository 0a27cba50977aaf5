"""Headline study: the routed runtime against standard serving, step-sync, model-sync, eager and LLM-only on one
GPU, with N = 1 / 16 and 2,048 vs 8,192 max output tokens; writes headline.json (the issue's keys) and a CSV.

    python studies/serving/headline.py --config studies/serving/headline.yaml --out OUT [--deadline 540]

Every cell is `tokenrouter bench --sim` against a `tokenrouter serve` of the same config (the baselines through
`--baseline`/`--policy`), so each row has the simulator's prediction beside the live number. Cells run in order
of importance and none starts past `--deadline` seconds; the CSV/JSON are rewritten after every cell.
The headline keys are whole-run throughputs (every request, the drain at the end included); `steady` holds the
same cells over the simulator's steady window (until a client first finds no request left). `markov_bound_tok_s`
is the Markov model at the deployed B for N = 8 on the config's profile (measured alone and
co-run step times). CPU smoke: `--device cpu` with a config naming tiny-small/tiny-large and `--scale 0.05`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_serving import KEYS, small_loop

from tokenrouter.bench.server import TR, scrape, start_server, stop_server


@dataclass(slots=True)
class Cell:
    key: str  # headline key it fills, or a plain name
    n: int
    workload: str = "low-effort"
    max_output: int | None = None
    requests_per_client: int = 3


# server tag -> (serve args beyond --config/--device, bench args, cells); in order of importance.
SERVERS: list[tuple[str, list[str], list[str], list[Cell]]] = [
    ("routed", [], ["--policy", "delayed"],
     [Cell("tokenrouter_tok_s", 8), Cell("n1_tok_s", 1, requests_per_client=8), Cell("n16_tok_s", 16)]),
    ("std-serving", ["--baseline", "std-serving"], ["--policy", "std-serving"],
     [Cell("std_serving_tok_s", 8), Cell("std_serving_long_n8", 8, "high-effort", 2048, 2)]),
    ("step-sync", ["--policy", "step-sync"], ["--policy", "step-sync"], [Cell("step_sync_tok_s", 8)]),
    ("routed-long", [], ["--policy", "delayed"],
     [Cell("out2048_tok_s", 8, "high-effort", 2048, 2), Cell("out8192_tok_s", 8, "high-effort", 8192, 2)]),
    ("eager", ["--policy", "eager"], ["--policy", "eager"], [Cell("eager_n8", 8)]),
    ("model-sync", ["--policy", "model-sync"], ["--policy", "model-sync"], [Cell("model_sync_n8", 8)]),
    ("llm-only", ["--baseline", "llm-only"], [], [Cell("llm_only_n8", 8, requests_per_client=2)]),
]  # fmt: skip


def markov_bound(config: str, n: int, max_output: int | None) -> tuple[float, list[int]]:
    """T(B) of the Markov model at the config's B for N = n (its per-N table, else its flat thresholds)."""
    from tokenrouter.core.config import load_config
    from tokenrouter.sim.propose import markov_at
    from tokenrouter.sim.run import SimConfig

    dep = load_config(config)
    table = dep.policy.table or {}
    b = tuple(table.get(n, dep.policy.thresholds))
    cfg = SimConfig(dep, workload="low-effort", num_requests=3 * n, concurrency=n, seed=0, max_output=max_output)
    return markov_at(cfg, b).throughput_tok_s, list(b)


def bench_cell(
    url: str,
    config: str,
    names: list[str],
    jf: Path,
    *,
    n: int,
    requests: int,
    workload: str,
    max_output: int | None,
    bench_args: list[str],
    timeout: float,
) -> tuple[dict, dict]:
    """One `tokenrouter bench` (with `--sim` when it names a policy) against a running server: its JSON record and
    each model's loop counters over the cell (`small_loop`); RuntimeError when the bench fails."""
    before = scrape(url)
    cmd = [*TR, "bench", "--url", url, "-n", str(n), "--num-requests", str(requests), "--workload", workload,
           "--seed", "0", "--json", str(jf), "--config", config, *bench_args]  # fmt: skip
    cmd += ["--max-output", str(max_output)] if max_output else []
    cmd += ["--sim"] if bench_args else []
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    after = scrape(url)
    if res.returncode != 0 or not jf.exists():
        raise RuntimeError(f"bench failed: {(res.stderr or res.stdout)[-400:]}")
    rec = json.loads(jf.read_text())
    jf.unlink()
    return rec, {m: small_loop(before, after, m) for m in names}


def start_study_server(
    a: argparse.Namespace, serve_args: list[str], log: Path
) -> tuple[subprocess.Popen, str, float | None, list[str]]:
    """`tokenrouter serve --config --device` plus `serve_args` on `a.port`, its log at `log`: (process, URL, startup
    seconds or None when it did not come up, the served model names; empty when it did not)."""
    proc, url, up = start_server(["--config", a.config, "--device", a.device, *serve_args], a.port, log, timeout_s=300)
    if up is None:
        print(f"{log.stem}: server did not come up: {log.read_text()[-600:] if log.exists() else ''}")
        return proc, url, None, []
    return proc, url, up, _get(url + "/v1/models")["data"][0]["id"].split("+")


def loop_columns(loops: dict[str, dict]) -> dict[str, float | None]:
    """Each model's `MODEL_step_ms` and `MODEL_rows_per_step` over a cell (`bench_cell`'s loop counters)."""
    return {f"{m}_{k}": lp[k] for m, lp in loops.items() for k in ("step_ms", "rows_per_step")}


def study_args(doc: str | None, servers: str, port: int) -> argparse.ArgumentParser:
    """The flags every live serving study here takes (the `--servers` groups it runs, a port to start them from)."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--servers", default=servers, help="which server groups to run")
    p.add_argument("--deadline", type=float, default=540.0)
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run with the tiny models")
    p.add_argument("--scale", type=float, default=1.0, help="multiply requests and output caps (smoke runs)")
    return p


def main() -> int:
    a = study_args(__doc__, ",".join(s[0] for s in SERVERS), 8200).parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    command = "python " + " ".join([sys.argv[0], *sys.argv[1:]])
    rows: list[dict] = []
    raw: dict = {"servers": {}}
    headline: dict = {"gpu": _gpu_name(a.device), "date": dt.date.today().isoformat(), "command": command}
    wanted = a.servers.split(",")

    def save() -> None:
        pd.DataFrame(rows).to_csv(out / "headline.csv", index=False)
        (out / "cells.json").write_text(json.dumps(raw, indent=1, default=str))
        (out / "headline.json").write_text(json.dumps(headline, indent=1))

    for tag, serve_args, bench_args, cells in SERVERS:
        if tag not in wanted:
            continue
        if time.monotonic() - t_start > a.deadline - 60:
            print(f"skip {tag}: deadline")
            continue
        proc, url, up, names = start_study_server(a, serve_args, out / f"serve_{tag}.log")
        raw["servers"][tag] = {"startup_s": up}
        if up is None:
            continue
        for c in cells:
            if time.monotonic() - t_start > a.deadline - 20:
                print(f"skip {tag} {c.key}: deadline")
                continue
            reqs = max(2, round(c.requests_per_client * c.n * a.scale))
            max_out = max(8, int((c.max_output or 2048) * a.scale)) if c.max_output or a.scale != 1.0 else None
            t0 = time.monotonic()
            try:
                rec, loops = bench_cell(url, a.config, names, out / f"bench_{tag}_{c.key}.json", n=c.n, requests=reqs,
                                        workload=c.workload, max_output=max_out, bench_args=bench_args,
                                        timeout=max(60.0, a.deadline))  # fmt: skip
            except RuntimeError as e:
                print(f"{tag} {c.key}: {e}")
                continue
            raw[f"{tag}/{c.key}"] = {"bench": rec, "loops": loops, "wall_s": time.monotonic() - t0}
            live = rec.get("output_throughput_tok_s")
            row = {"server": tag, "key": c.key, "N": c.n, "workload": c.workload, "max_output": c.max_output,
                   "requests": reqs, **{k: rec.get(k) for k in KEYS},
                   "steady_output_throughput_tok_s": rec.get("steady_output_throughput_tok_s"),
                   "sim_output_throughput_tok_s": rec.get("sim_output_throughput_tok_s"),
                   "sim_steady_output_throughput_tok_s": rec.get("sim_steady_output_throughput_tok_s")}  # fmt: skip
            row.update(loop_columns(loops))
            row.update({f"{m}_overhead_frac": lp["overhead_frac"] for m, lp in loops.items()})
            rows.append(row)
            if c.key.endswith("_tok_s"):
                headline[c.key] = live
                headline.setdefault("steady", {})[c.key] = rec.get("steady_output_throughput_tok_s")
            save()
            sim = row["sim_output_throughput_tok_s"]
            print(f"{tag} {c.key} N={c.n}: live {_f(live)} tok/s, sim {_f(sim)}, failed {rec.get('requests_failed')}"
                  f", {time.monotonic() - t0:.0f} s", flush=True)  # fmt: skip
        raw["servers"][tag]["shutdown_s"] = stop_server(proc, timeout_s=30)
        save()
    try:
        bound, b = markov_bound(a.config, 8, None)
        headline["markov_bound_tok_s"], headline["markov_bound_B"] = bound, b
    except Exception as e:  # the live cells are what this run is for; a model failure must not lose them
        headline["markov_bound_error"] = f"{type(e).__name__}: {e}"
    for k, base in (("std_serving_tok_s", "over_std_serving"), ("step_sync_tok_s", "over_step_sync"),
                    ("markov_bound_tok_s", "of_markov_bound")):  # fmt: skip
        if headline.get("tokenrouter_tok_s") and headline.get(k):
            headline.setdefault("ratios", {})[base] = headline["tokenrouter_tok_s"] / headline[k]
    if headline.get("n16_tok_s") and headline.get("n1_tok_s"):
        headline.setdefault("ratios", {})["n16_over_n1"] = headline["n16_tok_s"] / headline["n1_tok_s"]
    if headline.get("out8192_tok_s") and headline.get("out2048_tok_s"):
        long_ratio = headline["out8192_tok_s"] / headline["out2048_tok_s"]
        headline.setdefault("ratios", {})["out8192_over_out2048"] = long_ratio
    headline["python"] = platform.python_version()
    save()
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in headline.items()
                      if k not in ("command",)}))  # fmt: skip
    print(f"done in {time.monotonic() - t_start:.0f} s: {len(rows)} cells")
    return 0 if rows else 1


def _get(url: str) -> dict:
    import httpx

    return httpx.get(url, timeout=10).json()


def _gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
