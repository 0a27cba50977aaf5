"""Live cells for `trsim validate`: `tokenrouter serve` on the GPU, one server start per (policy family, SM split),
every cell switched through the admin endpoint (policy, thresholds, hop rate) and measured with
`tokenrouter bench`; one CSV row per cell with the `trsim run` flags that simulate it.

    python studies/fidelity/run_fidelity.py --config studies/fidelity/serve.yaml --out OUT --deadline 520

Cells: for every hop rate, N and policy of the grid (`--hops`, `--ns`, `--policies`; delayed uses the tuned
config for that hop rate, `--config-for-hop P=FILE`, else `--config`), then `--sweep "N:B1;B2,..."` (flat
thresholds at hop rate `--sweep-hop`) and `--splits` (SM splits SMALL/LARGE at `--split-n`, delayed, tuned B).
Asynchronous cells share one server; step-sync needs its own (a sync gate is built at start), as does every SM
split (an MPS share is set when a process starts) and every std-serving cell (its hop rate is set at start, and
its repeated loads slow down). The CSV is rewritten after every cell, so a run cut by its
deadline keeps what it measured. Rerun on CPU with the tiny pair: `--device cpu` and a tiny config.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd

from tokenrouter.bench.server import TR, start_server, stop_server

KEY = "fidelity"
LIVE = ("output_throughput_tok_s", "steady_output_throughput_tok_s", "tpot_ms_p50", "tpot_ms_mean", "ttft_ms_p50",
        "e2e_ms_mean", "hops_mean", "requests_completed", "requests_failed")  # fmt: skip


def set_policy(url: str, policy: str, hop: float, thresholds: list[int] | None, table: dict | None) -> None:
    body: dict = {"policy": policy, "hop_rate": hop}
    if thresholds:
        body["thresholds"] = thresholds
    if table:
        body["table"] = {str(k): v for k, v in table.items()}
    r = httpx.post(url + "/admin/policy", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    r.raise_for_status()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, type=Path, help="deployment YAML (delayed cells use its table)")
    p.add_argument(
        "--config-for-hop",
        action="append",
        default=[],
        metavar="P=FILE",
        help="tuned config for hop rate P (delayed cells at P use its table)",
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--csv-base", type=Path, default=None,
                   help="the folder the CSV will be validated from (default --out): its rows name their --config "
                        "relative to it, the rule `trsim validate` reads them by")  # fmt: skip
    p.add_argument("--ns", default="8,1,4,16")
    p.add_argument("--hops", default="0.1,0.05,0.2")
    p.add_argument("--policies", default="delayed,eager,step-sync")
    p.add_argument("--workload", default="low-effort")
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--sweep", default="", help="'N:B;B,...' flat delayed thresholds tried live, e.g. '8:1,1;1,7'")
    p.add_argument("--sweep-hop", type=float, default=0.1)
    p.add_argument(
        "--splits",
        default="",
        help="SM splits SMALL/LARGE tried at --split-n (delayed), each with its "
        "tuned B (flat) or the config's table: '40/60=1,4;60/40=2,6;70/100'",
    )
    p.add_argument("--split-n", type=int, default=8)
    p.add_argument("--requests-per-n", type=int, default=3, help="requests per cell: this many per client (at least 8)")
    p.add_argument("--deadline", type=float, default=540.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--port", type=int, default=8200)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    configs = {float(k): Path(v) for k, v in (x.split("=", 1) for x in a.config_for_hop)}
    ns = [int(x) for x in a.ns.split(",") if x]
    hops = [float(x) for x in a.hops.split(",") if x]
    pols = [x for x in a.policies.split(",") if x and x != "none"]
    rows: list[dict] = []
    # (server group, sm split) -> cells (label, policy, hop, N, thresholds or None for the tuned table)
    groups: dict[tuple[str, str], list[tuple[str, str, float, int, list[int] | None]]] = {}
    for pol in pols:
        fam = "sync" if pol in ("step-sync", "model-sync") else "async"
        for n in ns:
            for hop in hops:
                # std-serving is a server of its own, its hop rate fixed at start; one per cell, since its repeated
                # loads slow down (a second load ran at 57% of the first at N = 64)
                key = (f"std-{hop:g}-{n}" if pol == "std-serving" else fam, "100/100")
                groups.setdefault(key, []).append((f"{pol} p={hop} N={n}", pol, hop, n, None))
    for item in filter(None, a.sweep.split(" ")):
        n_text, bs = item.split(":")
        for b in bs.split(";"):
            th = [int(x) for x in b.split(",")]
            groups.setdefault(("async", "100/100"), []).append(
                (f"delayed B={b} p={a.sweep_hop} N={n_text}", "delayed", a.sweep_hop, int(n_text), th)
            )
    for item in filter(None, a.splits.split(";")):
        split, _, b = item.partition("=")
        th = [int(x) for x in b.split(",")] if b else None
        groups.setdefault(("async", split), []).append(
            (f"delayed SM {split} B={b or 'table'} p={a.sweep_hop} N={a.split_n}", "delayed", a.sweep_hop, a.split_n,
             th))  # fmt: skip
    base = a.out
    csv_base = (a.csv_base or a.out).resolve()

    def save() -> None:
        pd.DataFrame(rows).to_csv(base / "live.csv", index=False)

    port = a.port
    for (fam, split), cells in groups.items():
        if time.monotonic() - t_start > a.deadline - 120:
            print(f"skip server {fam} {split}: deadline", flush=True)
            continue
        sa, sb = (int(x) for x in split.split("/"))
        extra = ["--policy", "step-sync" if fam == "sync" else "eager"]
        if fam.startswith("std-"):
            extra = ["--policy", "std-serving", "--hop-rate", fam.split("-")[1]]
        shares = None
        if (sa, sb) != (100, 100):
            shares = f"{sa},{sb}"
            extra += ["--sm-percent", shares]
        port += 1
        log = base / f"serve_{fam}_{split.replace('/', '-')}.log"
        args = ["--config", str(a.config), "--device", a.device, "--admin-key", KEY, "--no-access-log", *extra]
        proc, url, up = start_server(args, port, log)
        if up is None:
            print(f"server {fam} {split} did not come up:\n{log.read_text()[-2000:]}", flush=True)
            continue
        print(f"server {fam} {split}: up in {up:.0f} s", flush=True)
        try:
            for label, pol, hop, n, th in cells:
                if time.monotonic() - t_start > a.deadline - 25:
                    print(f"skip {label}: deadline", flush=True)
                    continue
                cfg = configs.get(hop, a.config)
                table = None
                if pol == "delayed" and th is None:
                    import yaml

                    table = yaml.safe_load(cfg.read_text())["policy"]["table"]
                if pol != "std-serving":  # the baseline has no routed policy to set
                    set_policy(url, pol, hop, th, table)
                reqs = max(8, a.requests_per_n * n)
                jf = base / "cell.json"
                cmd = [*TR, "bench", "--url", url, "-n", str(n), "--num-requests", str(reqs), "--workload", a.workload,
                       "--max-output", str(a.max_output), "--seed", "0", "--json", str(jf)]  # fmt: skip
                t0 = time.monotonic()
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                if res.returncode != 0 or not jf.exists():
                    print(f"{label}: bench failed: {(res.stderr or res.stdout)[-300:]}", flush=True)
                    continue
                rec = json.loads(jf.read_text())
                jf.unlink()
                sim = ["--config", os.path.relpath(cfg.resolve(), csv_base), "--policy", pol, "--hop-rate", str(hop),
                       "-n", str(n),
                       "--workload", a.workload, "--max-output", str(a.max_output), "--num-requests", str(reqs),
                       "--seed", "0"]  # fmt: skip
                if th is not None:
                    sim += ["--thresholds", ",".join(map(str, th))]
                if shares:
                    sim += ["--sm-percent", shares]
                row = {"cell": label, "args": shlex.join(sim), "policy": pol, "hop_rate": hop, "N": n,
                       "thresholds": ",".join(map(str, th)) if th else ("table" if pol == "delayed" else ""),
                       "sm_split": split, "wall_s": round(time.monotonic() - t0, 1),
                       **{k: rec.get(k) for k in LIVE}}  # fmt: skip
                for i in range(2):
                    for key in ("busy_frac", "batch_mean", "tokens"):
                        row[f"{key}_model{i}"] = rec.get(f"{key}_model{i}")
                rows.append(row)
                save()
                print(f"{label}: {row['output_throughput_tok_s']:.1f} tok/s, TPOT p50 {row['tpot_ms_p50']:.2f} ms",
                      flush=True)  # fmt: skip
        finally:
            stop_server(proc)
    save()
    print(f"done in {time.monotonic() - t_start:.0f} s: {len(rows)} cells -> {base / 'live.csv'}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
