"""Measure a finished calibration's co-location grid again on other passes, keeping everything else it measured.

`tr calibrate` resumes a run only under the same plan. This writes OUT.partial.json: a copy of a finished run's
partial whose plan has the new co-run grid (and, with --splits, other SM splits), with its co-run results
dropped, so that `tr calibrate ... -o OUT` with the same grid flags measures the co-runs alone and fits the
whole profile again (the model passes, serving loop and runtime costs are the copied run's).

    python studies/calibration/regrid_corun.py --source studies/calibration/serving-2026-12-02/call2.partial.json \
        --out OUT.json --corun-small 1,4,16,32,64 --corun-large 1,4,16,64,128,256,512
    tr calibrate -m qwen3-0.6b -m qwen3-32b --corun-small 1,4,16,32,64 \
        --corun-large 1,4,16,64,128,256,512 -o OUT.json            # on the GPU: the co-runs only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def regrid(source: dict, small: list[int], large: list[int], splits: list[list[int]] | None,
           plain: bool = False) -> dict:  # fmt: skip
    """`source` (a partial) with the co-run grid replaced and its co-run results dropped. `plain`: the plan of a
    command without --quick (a --quick plan fixes its own grid, so a re-gridded quick run cannot resume)."""
    out = json.loads(json.dumps(source))
    plan = out["plan"]
    plan["corun_batches_a"], plan["corun_batches_b"] = small, large
    if splits:
        plan["splits"] = splits
    if plain and plan.get("quick"):
        plan.update(quick=False, corun_held=[[2, 8], [8, 2]], corun_context=1024)
    out["results"] = {k: v for k, v in out["results"].items() if not k.startswith("corun/")}
    out["failed"] = {}
    out["command"] = f"(co-runs re-gridded from: {source.get('command', '?')})"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="a finished run's OUT.partial.json")
    p.add_argument("--out", type=Path, required=True, help="the profile the new run writes (OUT)")
    p.add_argument("--corun-small", required=True)
    p.add_argument("--corun-large", required=True)
    p.add_argument("--splits", default="", help="SM splits 'a/b,...' (default: the source's)")
    p.add_argument("--plain", action="store_true", help="a --quick source, resumed by a command without --quick")
    a = p.parse_args()
    splits = [[int(x) for x in s.split("/")] for s in a.splits.split(",") if s] or None
    new = regrid(json.loads(a.source.read_text()), ints(a.corun_small), ints(a.corun_large), splits, a.plain)
    dest = a.out.with_name(a.out.name + ".partial.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(new, indent=1))
    print(f"wrote {dest}: tasks kept {sorted(new['results'])}")


if __name__ == "__main__":
    main()
