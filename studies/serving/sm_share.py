"""Co-location under MPS: does capping the large model's SM share leave the small model room enough to pay?

    python studies/serving/sm_share.py --config studies/serving/curve/tuned-2026-12-04.yaml --out OUT \
        --splits "100,100;100,90;100,80" --cells "8:3,6;64:23,42" --repeats 2 --deadline 540

One `tokenrouter serve --sm-percent SPLIT` per split and repeat (an MPS share is fixed when a subserver's CUDA
context starts, so a split cannot change on a running server); the splits run in turn, their order reversed on
every other repeat so a drift of the machine cancels. On each server every cell (N clients, the flat B named) runs
one `tokenrouter bench` of `--requests-per-n` x N requests, low-effort prompts, outputs 256 (the server's B is the
config's for N: name it in the cell; `--sim` beside it only at `--sim-splits`, the splits the profile measured). Writes
sm_share.csv (one row per load: split, repeat, N, B, live and simulated tok/s, TPOT p50, each model's step time
and rows per step) after every load and prints the mean per split and cell, with its gap to 100,100.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import _f, _gpu_name, bench_cell, loop_columns, start_study_server, study_args

from tokenrouter.bench.server import stop_server

BASE = "100,100"


def parse_cells(text: str) -> list[tuple[int, str]]:
    """'8:3,6;64:23,42' -> [(8, '3,6'), (64, '23,42')]."""
    cells = []
    for part in filter(None, text.split(";")):
        n, _, b = part.partition(":")
        if not n.strip().isdigit() or not b:
            raise SystemExit(f"error: cell {part!r} is not N:B (e.g. 8:3,6)")
        cells.append((int(n), b.strip()))
    return cells


def split_order(splits: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, split) in run order: as given, then reversed, alternating (ABBA...)."""
    return [(r, s) for r in range(repeats) for s in (splits if r % 2 == 0 else splits[::-1])]


def gaps(df: pd.DataFrame) -> pd.DataFrame:
    """Mean live tok/s per (N, B, split) and its gap to the 100,100 split of the same cell (+ = faster)."""
    m = df.groupby(["N", "B", "split"], sort=False)["tok_s"].agg(["mean", "count"]).reset_index()
    base = m[m.split == BASE].set_index(["N", "B"])["mean"]
    m["vs_base"] = [r["mean"] / base.get((r["N"], r["B"]), float("nan")) - 1.0 for _, r in m.iterrows()]
    return m


def main() -> int:
    p = study_args(__doc__, "routed", 8400)
    p.add_argument("--splits", default="100,100;100,90;100,80", help="SM shares SMALL,LARGE per server, ';'-separated")
    p.add_argument("--cells", default="8:3,6;64:23,42", help="N:B loads run on every server")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--requests-per-n", type=int, default=8)
    p.add_argument("--sim-splits", default=BASE, help="splits to run `bench --sim` at (the profile's measured ones)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cells, splits = parse_cells(a.cells), [s.strip() for s in a.splits.split(";") if s.strip()]
    meta = {"gpu": _gpu_name(a.device), "date": dt.date.today().isoformat(), "command": "python " + " ".join(sys.argv)}
    rows: list[dict] = []
    for rep, split in split_order(splits, a.repeats):
        if time.monotonic() - t0 > a.deadline - 60:
            print(f"skip split {split} repeat {rep}: deadline")
            continue
        log = out / f"serve_{split.replace(',', '_')}_{rep}.log"
        proc, url, up, names = start_study_server(a, ["--sm-percent", split], log)
        if up is None:
            continue
        for n, b in cells:
            if time.monotonic() - t0 > a.deadline - 20:
                break
            # The server runs the config's B for N; --sim prices only the SM splits the profile measured.
            bench = ["--policy", "delayed", "--thresholds", b] if split in a.sim_splits.split(";") else []
            try:
                rec, loops = bench_cell(url, a.config, names, out / "bench.json", n=n, requests=a.requests_per_n * n,
                                        workload="low-effort", max_output=max(8, int(256 * a.scale)),
                                        bench_args=bench, timeout=max(60.0, a.deadline))  # fmt: skip
            except RuntimeError as e:
                print(f"split {split} N={n}: {e}")
                continue
            row = {"split": split, "repeat": rep, "N": n, "B": b, "tok_s": rec.get("output_throughput_tok_s"),
                   "sim_tok_s": rec.get("sim_output_throughput_tok_s"), "tpot_ms_p50": rec.get("tpot_ms_p50"),
                   "failed": rec.get("requests_failed")}  # fmt: skip
            row.update(loop_columns(loops))
            rows.append(row)
            pd.DataFrame(rows).to_csv(out / "sm_share.csv", index=False)
            print(f"split {split} rep {rep} N={n} B {b}: live {_f(row['tok_s'])} tok/s, sim {_f(row['sim_tok_s'])}",
                  flush=True)  # fmt: skip
        stop_server(proc, timeout_s=30)
    if not rows:
        return 1
    table = gaps(pd.DataFrame(rows))
    (out / "sm_share.json").write_text(json.dumps({**meta, "means": table.to_dict("records")}, indent=1))
    print(table.to_string(index=False))
    print(f"done in {time.monotonic() - t0:.0f} s: {len(rows)} loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
