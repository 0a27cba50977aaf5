"""Put a calibration's CUDA-graph pass tables (decode and varlen graphs, and the graph step line fitted from them)
of Qwen3-0.6B and Qwen3-32B into the bundled profile, in place of the ones there. The eager tables, host lines,
runtime costs, routers and the co-location grid stay: the grid stores co-run over alone factors, so it follows the
new alone tables.

    python studies/calibration/bundle_passes.py --source studies/calibration/passes-2026-12-04/h200-passes.json

Why only the graph passes: they are GPU-bound and repeat within 1-2% between machines, while the eager passes and
the runtime's message costs time the host, which a busy or different host moves by 2x (the 2026-12-04 run: eager
passes 2.5x and a ZeroMQ message 2x the bundled ones, right after a killed pytest left its children running).
It rewrites calibration/profiles/h200-measured.json and names the source in the profile's notes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "calibration/profiles/h200-measured.json"
MODELS = ("qwen3-0.6b", "qwen3-32b")
GRAPH_PASSES = ("decode", "varlen", "varlen_max_pad")


def bundle(prof: dict, source: dict, src_name: str, models: tuple[str, ...] = MODELS) -> dict:
    """`prof` with each model's graph passes and graph step line taken from `source` (both profile dicts)."""
    for name in models:
        new, old = source["models"][name], prof["models"][name]
        if new["weight_bytes"] != old["weight_bytes"]:
            raise ValueError(f"{name}: {src_name} profiles another model ({new['weight_bytes']} weight bytes)")
        for key in GRAPH_PASSES:
            old["passes"][key] = new["passes"][key]
        old["step"]["graph"] = new["step"]["graph"]
    prof["notes"]["graph_passes"] = (
        f"{', '.join(models)} decode/varlen graph tables from {src_name} (bundled by "
        "studies/calibration/bundle_passes.py; eager tables, host lines and runtime costs from earlier runs)"
    )
    return prof


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="a profile `tr calibrate` wrote")
    a = p.parse_args()
    src = a.source.resolve().relative_to(ROOT)
    prof = bundle(json.loads(BUNDLED.read_text()), json.loads(a.source.read_text()), str(src))
    BUNDLED.write_text(json.dumps(prof, indent=2) + "\n")
    for name in MODELS:
        first = prof["models"][name]["passes"]["decode"]["points"][0]
        print(f"{BUNDLED.relative_to(ROOT)}: {name} graph passes from {src} (decode b=1: {first['ms']:.3f} ms)")


if __name__ == "__main__":
    main()
