"""Autotune's acceptance in one summary.json, from the live runs that measured each part of it.

    python studies/autotune/acceptance.py --out studies/autotune/results/2026-12-04-acceptance \
        --shift studies/autotune/results/2026-12-04-inbench-2 \
        --shift studies/autotune/results/2026-12-04-inbench-nramp-2 \
        --stable studies/autotune/results/2026-12-04-stable

A shift run (the hop shift, the N ramp) measures the gap after each shift; the stable run alternates autotune with
a paused, static B for minutes at one load. No single 10-minute device call holds both, so this reads their
`summary.json` files and writes OUT/summary.json: `worst_gap_after_shift` (the largest over the shift runs),
`stable_cost` (the stable run's), `lost_requests` (summed over every run), each part's source, and whether each
meets the issue's bar (gap <= 2%, stable cost <= 1%, nothing lost). Reads only files; no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BARS = {"worst_gap_after_shift": 0.02, "stable_cost": 0.01, "lost_requests": 0.0}


def _load(run: Path) -> dict:
    path = run / "summary.json" if run.is_dir() else run
    if not path.is_file():
        raise SystemExit(f"error: no summary.json at {path}")
    return json.loads(path.read_text())


def _source(run: Path, s: dict, key: str) -> dict:
    return {"run": str(run), key: s.get(key), "lost_requests": s.get("lost_requests"), "date": s.get("date"),
            "gpu": s.get("gpu"), "commit": s.get("commit")}  # fmt: skip


def combine(shift: dict[Path, dict], stable: dict[Path, dict]) -> dict:
    """The acceptance summary of `shift` and `stable` runs (path -> summary). A part that no run measured is None;
    so is `lost_requests` when any run did not count it."""
    gaps = [s["worst_gap_after_shift"] for s in shift.values() if s.get("worst_gap_after_shift") is not None]
    costs = [s["stable_cost"] for s in stable.values() if s.get("stable_cost") is not None]
    lost = [s.get("lost_requests") for s in (*shift.values(), *stable.values())]
    out = {
        "worst_gap_after_shift": max(gaps) if gaps else None,
        # Several stable runs: the worst of them, so a good run cannot hide a bad one.
        "stable_cost": max(costs) if costs else None,
        "lost_requests": None if not lost or None in lost else sum(lost),
    }
    out["meets"] = {k: None if out[k] is None else out[k] <= bar for k, bar in BARS.items()}
    out["sources"] = {
        "shift": [_source(p, s, "worst_gap_after_shift") for p, s in shift.items()],
        "stable": [_source(p, s, "stable_cost") for p, s in stable.items()],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shift", type=Path, action="append", default=[], help="a shift run's folder (repeatable)")
    p.add_argument("--stable", type=Path, action="append", default=[], help="a stable run's folder (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="folder for the combined summary.json")
    a = p.parse_args(argv)
    if not a.shift and not a.stable:
        p.error("name at least one --shift or --stable run")
    res = combine({r: _load(r) for r in a.shift}, {r: _load(r) for r in a.stable})
    res["command"] = "python studies/autotune/acceptance.py " + " ".join(sys.argv[1:] if argv is None else argv)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in (*BARS, "meets")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
