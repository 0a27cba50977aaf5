"""Overlap off/on from `trsim sweep` output: steady tok/s per policy, hop rate and N, the gain, wasted rows.

python studies/overlap/summarize.py studies/overlap/sweep.csv
"""

from __future__ import annotations

import sys

import pandas as pd


def main(path: str) -> None:
    df = pd.read_csv(path)
    keys = ["arg_policy", "arg_hop_rate", "arg_concurrency"]
    t = df.pivot_table(index=keys, columns="arg_overlap", values="steady_output_throughput_tok_s")
    wasted = df[df["arg_overlap"]].set_index(keys)["wasted_rows"]
    print("| policy | p | N | overlap off tok/s | overlap on tok/s | gain | rows wasted (on) |")
    print("|---|---|---|---|---|---|---|")
    for (policy, p, n), row in t.iterrows():
        off, on = row[False], row[True]
        print(f"| {policy} | {p} | {n} | {off:,.0f} | {on:,.0f} | {on / off - 1:+.1%} | {wasted[(policy, p, n)]:,} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "studies/overlap/sweep.csv")
