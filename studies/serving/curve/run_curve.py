"""Curve study (issue 24): throughput and TPOT against concurrency N for the routed runtime and its baselines on
one GPU, the simulator's prediction beside every cell, and the 8,192-token cells.

    python studies/serving/curve/run_curve.py --config studies/serving/headline.yaml --out OUT [--deadline 540]

Servers (one `tokenrouter serve` each, cells `tokenrouter bench --sim`): routed (delayed, the config's tuned table),
eager, std-serving (`--baseline std-serving`), step-sync (N <= 16 only: it is slowest and the issue asks no more);
N in `--n` (1, 2, 4, 8, 16, 32, 64, 128), 4 N requests per cell, low-effort prompts, outputs 256; plus N = 8 with
outputs of exactly 8,192 tokens after 100-token prompts (`fixed:100,8192`) for routed and std-serving. Cells run
server by server, N ascending, none past `--deadline`; the CSV/JSON are rewritten after every cell. Writes
curve.csv, cells.json, curve.json (the issue's headline keys: `n8_tok_s`, `n64_tok_s`, `min_ratio_vs_std_4_64`,
`long_output_ratio`) and curve.png (throughput against N; TPOT p50 against throughput). `small_b1_step_ms` comes from
studies/engine/step_profile.py, not from here.
CPU smoke: a config naming tiny-small/tiny-large with `--device cpu --scale 0.05 --n 1,2`.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headline import _f, _get, _gpu_name, bench_cell, loop_columns, start_study_server, study_args
from run_serving import KEYS

from tokenrouter.bench.server import stop_server

# tag -> (serve args beyond --config/--device, bench args, largest N)
SERVERS: dict[str, tuple[list[str], list[str], int]] = {
    "routed": ([], ["--policy", "delayed"], 1 << 30),
    "std-serving": (["--baseline", "std-serving"], ["--policy", "std-serving"], 1 << 30),
    "eager": (["--policy", "eager"], ["--policy", "eager"], 1 << 30),
    "step-sync": (["--policy", "step-sync"], ["--policy", "step-sync"], 16),
}
LONG_CELLS = {"routed", "std-serving"}  # N = 8 with outputs LONG_OUTPUT beside the SHORT_OUTPUT cells
SHORT_OUTPUT, LONG_OUTPUT = 256, 8192
# The long cells' workload: every output exactly LONG_OUTPUT tokens after a prompt of low-effort's mean length. (Cells
# before 2026-12-05 ran low-effort capped at LONG_OUTPUT: its outputs stop at 2,048, mean ~780 tokens.)
LONG_PROMPT = 100


def cell_workload(max_output: int, scale: float) -> tuple[str, int]:
    """(workload, max_output) of a cell: low-effort capped at SHORT_OUTPUT, or fixed LONG_PROMPT + LONG_OUTPUT."""
    out = max(8, int(max_output * scale))
    return ("low-effort", out) if max_output == SHORT_OUTPUT else (f"fixed:{LONG_PROMPT},{out}", out)


EXTRA = ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p99")


def requests_that_fit(kv_capacity_tokens: dict[str, int], prompt: int, output: int) -> int | None:
    """How many requests of `prompt` + `output` tokens the smallest KV pool (a request visits every model) holds at
    once, from the server's model card; None when the card does not say. A long cell with fewer than N of them
    measures the queue, not the engine (an H100 holds 3 of the 8,192-token cell's 8 beside the 32B's weights)."""
    if not kv_capacity_tokens:
        return None
    return min(kv_capacity_tokens.values()) // (prompt + output)


def headline_keys(rows: list[dict]) -> dict[str, float]:
    """The issue's keys from the cells measured so far (absent when a cell is missing)."""
    df = pd.DataFrame(rows)
    out: dict[str, float] = {}
    if df.empty:
        return out
    short = df[df.max_output == SHORT_OUTPUT]

    def tok(server: str, n: int, frame=short) -> float | None:
        hit = frame[(frame.server == server) & (frame["N"] == n)]
        return float(hit.output_throughput_tok_s.iloc[0]) if len(hit) else None

    for n, key in ((8, "n8_tok_s"), (64, "n64_tok_s")):
        if tok("routed", n) is not None:
            out[key] = tok("routed", n)
    ratios = [tok("routed", n) / tok("std-serving", n) for n in (4, 8, 16, 32, 64)
              if tok("routed", n) and tok("std-serving", n)]  # fmt: skip
    if ratios:
        out["min_ratio_vs_std_4_64"] = min(ratios)
    long_rows = df[df.max_output == LONG_OUTPUT]
    long = tok("routed", 8, long_rows)
    fit = long_rows[long_rows.server == "routed"].get("kv_requests_fit")
    bound = fit is not None and len(fit) and pd.notna(fit.iloc[0]) and fit.iloc[0] < 8
    if bound:  # no ratio from a queue: say why it is missing
        out["long_output_kv_requests_fit"] = int(fit.iloc[0])
    elif long and tok("routed", 8):
        out["long_output_ratio"] = long / tok("routed", 8)
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows)
    df = df[df.max_output == SHORT_OUTPUT]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (server, g) in enumerate(df.groupby("server")):
        g, c = g.sort_values("N"), f"C{i}"  # one colour per server: its live line and its simulated one
        ax1.plot(g.N, g.output_throughput_tok_s, "o-", color=c, label=f"{server} live")
        ax1.plot(g.N, g.sim_output_throughput_tok_s, "x--", color=c, alpha=0.6, label=f"{server} sim")
        ax2.plot(g.output_throughput_tok_s, g.tpot_ms_p50, "o-", color=c, label=server)
    ax1.set(xscale="log", xlabel="concurrency N", ylabel="output tok/s (whole run)")
    ax2.set(xlabel="output tok/s", ylabel="TPOT p50 ms")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def kv_capacities(url: str) -> dict[str, int]:
    """model name -> KV capacity in tokens, from the server's model card (empty when the card has none)."""
    import httpx

    try:
        card = _get(url + "/v1/models")["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return {}
    return {str(k): int(v) for k, v in card.get("tokenrouter", {}).get("kv_capacity_tokens", {}).items()}


def main() -> int:
    p = study_args(__doc__, ",".join(SERVERS), 8300)
    p.add_argument("--n", default="1,2,4,8,16,32,64,128", help="concurrency levels")
    p.add_argument(
        "--long-cells",
        default=",".join(sorted(LONG_CELLS)),
        help=f"servers that also run N = 8 with {LONG_OUTPUT}-token outputs (when 8 is in --n); '' for none",
    )
    p.add_argument(
        "--step-logs",
        action="store_true",
        help="each server writes its step logs to OUT/steps_<server> (tokenrouter serve --step-logs); every cell's "
        "monotonic-clock window goes in cells.json (curve/step_timeline.py reads both)",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine switch for every server (tokenrouter serve --engine; repeat for several)",
    )
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    ns = [int(x) for x in a.n.split(",")]
    rows: list[dict] = []
    raw: dict = {"servers": {}}
    meta = {"gpu": _gpu_name(a.device), "date": dt.date.today().isoformat(),
            "command": "python " + " ".join(sys.argv), "engine": a.engine}  # fmt: skip

    def save() -> None:
        pd.DataFrame(rows).to_csv(out / "curve.csv", index=False)
        (out / "cells.json").write_text(json.dumps(raw, indent=1, default=str))
        (out / "curve.json").write_text(json.dumps({**meta, **headline_keys(rows)}, indent=1))

    for tag in a.servers.split(","):
        serve_args, bench_args, n_max = SERVERS[tag]
        cells = [(n, SHORT_OUTPUT) for n in ns if n <= n_max]
        cells += [(8, LONG_OUTPUT)] if tag in a.long_cells.split(",") and 8 in ns else []
        if time.monotonic() - t_start > a.deadline - 60:
            print(f"skip {tag}: deadline")
            continue
        logs = ["--step-logs", str(out / f"steps_{tag}")] if a.step_logs else []
        engine = [x for kv in a.engine for x in ("--engine", kv)]
        proc, url, up, names = start_study_server(a, [*serve_args, *logs, *engine], out / f"serve_{tag}.log")
        raw["servers"][tag] = {"startup_s": up}
        if up is None:
            continue
        caps = kv_capacities(url)
        raw["servers"][tag]["kv_capacity_tokens"] = caps
        for n, max_out in cells:
            if time.monotonic() - t_start > a.deadline - 20:
                print(f"skip {tag} N={n} out={max_out}: deadline")
                continue
            reqs = max(2, round(4 * n * a.scale))
            t0 = time.monotonic()
            workload, cap = cell_workload(max_out, a.scale)
            try:
                rec, loops = bench_cell(url, a.config, names, out / f"bench_{tag}_{n}_{max_out}.json", n=n,
                                        requests=reqs, workload=workload, max_output=cap, bench_args=bench_args,
                                        timeout=max(60.0, a.deadline))  # fmt: skip
            except RuntimeError as e:
                print(f"{tag} N={n}: {e}")
                continue
            raw[f"{tag}/{n}/{max_out}"] = {"bench": rec, "loops": loops, "wall_s": time.monotonic() - t0,
                                           "window": [t0, time.monotonic()], "max_output": cap}  # fmt: skip
            row = {"server": tag, "N": n, "max_output": max_out, "workload": workload, "requests": reqs,
                   **{k: rec.get(k) for k in (*KEYS, *EXTRA)},
                   **{f"sim_{k}": rec.get(f"sim_{k}") for k in ("output_throughput_tok_s", *EXTRA)}}  # fmt: skip
            row.update(loop_columns(loops))
            if max_out == LONG_OUTPUT:
                row["kv_requests_fit"] = fit = requests_that_fit(caps, LONG_PROMPT, cap)
                if fit is not None and fit < n:
                    print(f"warning: {tag} N={n} out={max_out}: the KV pool ({min(caps.values()):,} tokens) holds "
                          f"{fit} of the {n} requests at once: this cell measures the queue", flush=True)  # fmt: skip
            rows.append(row)
            save()
            live, sim = _f(row["output_throughput_tok_s"]), _f(row["sim_output_throughput_tok_s"])
            print(f"{tag} N={n} out={max_out}: live {live} tok/s, sim {sim}, {time.monotonic() - t0:.0f} s", flush=True)
        raw["servers"][tag]["shutdown_s"] = stop_server(proc, timeout_s=30)
        save()
    if rows:
        plot(rows, out / "curve.png")
    print(json.dumps(headline_keys(rows)))
    print(f"done in {time.monotonic() - t_start:.0f} s: {len(rows)} cells")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
