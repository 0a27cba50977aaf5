"""One model's passes in two live runs of the same cell, compared by shape: an A/B of an engine switch that needs
no finished cell. Whole-run throughput of a cut-short or noisy cell mixes the switch with the load's course; passes
of the same shape (rows, each row's tokens at most `--max-row-tokens`, mean row context in bins of `--ctx-bin`)
compare the engine alone.

    python studies/serving/curve/run_curve.py ... --step-logs --out A            # on the GPU, switch off
    python studies/serving/curve/run_curve.py ... --step-logs --out B --engine extend_split_keys=1024
    python studies/serving/curve/pass_ab.py A B [--model 1] [--out ab.csv]       # anywhere (CPU): this table

A and B: run_curve OUT folders (step logs in `steps_routed/`, plain or gzipped) or step-log folders. `--after`
cell key: only passes launched after that cell's window ended (cells.json), e.g. the long cell behind a 256-token
one; default every pass. Device times are the logged CUDA-event pass times (`gpu_ms`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timeline import read_logs


def passes(out: Path, model: int, after: str | None) -> pd.DataFrame:
    """The model's passes of one run: rows, largest row's tokens, mean row context, device ms."""
    logs_dir = out / "steps_routed" if (out / "steps_routed").is_dir() else out
    recs = read_logs(logs_dir).get(model, [])
    start = float("-inf")
    if after is not None:
        cells = json.loads((out / "cells.json").read_text())
        if after not in cells:
            known = ", ".join(k for k in cells if "/" in k)
            raise SystemExit(f"{out}/cells.json has no cell {after!r} (it has {known})")
        start = cells[after]["window"][1]
    rows = [{"rows": r["rows"], "max_row_tokens": max(r["row_tokens"]), "ctx": sum(r["row_ctx"]) / len(r["row_ctx"]),
             "gpu_ms": r["gpu_ms"]}
            for r in recs if r["launch"] >= start and r.get("row_tokens") and r.get("gpu_ms") is not None]  # fmt: skip
    return pd.DataFrame(rows, columns=["rows", "max_row_tokens", "ctx", "gpu_ms"])


def compare(a: pd.DataFrame, b: pd.DataFrame, *, max_row_tokens: int, ctx_bin: int, min_passes: int) -> pd.DataFrame:
    """Mean device ms of A's and B's passes in each (rows, context bin) with at least `min_passes` on both sides."""

    def shape_means(df: pd.DataFrame) -> pd.DataFrame:
        df = df[df.max_row_tokens <= max_row_tokens]
        df = df.assign(ctx_lo=(df.ctx // ctx_bin * ctx_bin).astype(int))
        return df.groupby(["rows", "ctx_lo"]).gpu_ms.agg(["size", "mean"])

    j = shape_means(a).merge(shape_means(b), left_index=True, right_index=True, suffixes=("_a", "_b"))
    j = j[(j.size_a >= min_passes) & (j.size_b >= min_passes)]
    j = j.rename(columns={"size_a": "passes_a", "mean_a": "ms_a", "size_b": "passes_b", "mean_b": "ms_b"})
    j["change_pct"] = (j.ms_b / j.ms_a - 1) * 100
    return j.reset_index()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="run A (the baseline)")
    p.add_argument("b", type=Path, help="run B (the switch)")
    p.add_argument("--model", type=int, default=1, help="model index of the step logs (1: the large model)")
    p.add_argument("--after", default=None, help="cell key: only passes launched after its window (cells.json)")
    p.add_argument("--max-row-tokens", type=int, default=16, help="passes whose rows all carry at most this many")
    p.add_argument("--ctx-bin", type=int, default=2000, help="mean row context bins, in keys")
    p.add_argument("--min-passes", type=int, default=5, help="shapes with fewer passes on either side are left out")
    p.add_argument("--out", type=Path, default=None, help="write the table as CSV")
    args = p.parse_args(argv)
    if args.max_row_tokens < 1 or args.ctx_bin < 1 or args.min_passes < 1:
        p.error("--max-row-tokens, --ctx-bin and --min-passes must be >= 1")
    t = compare(passes(args.a, args.model, args.after), passes(args.b, args.model, args.after),
                max_row_tokens=args.max_row_tokens, ctx_bin=args.ctx_bin, min_passes=args.min_passes)  # fmt: skip
    if t.empty:
        print("no pass shape with enough passes on both sides")
        return 1
    if args.out:
        t.to_csv(args.out, index=False)
    w = t[["passes_a", "passes_b"]].min(axis=1)
    print(t.round(2).to_string(index=False))
    print(f"B against A, mean over shapes weighted by passes: {(t.change_pct * w).sum() / w.sum():+.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
