"""Put a calibration's co-location grid for Qwen3-0.6B + Qwen3-32B under MPS into the bundled profile, in place of
the one there. Everything else in the bundled profile stays (its passes, std-serving and runtime costs).

    python studies/calibration/bundle_corun.py --source studies/calibration/corun-2026-12-03b/h200-2026-12-03b.json
    python studies/calibration/bundle_corun.py --source studies/calibration/h200-2026-12-02.json   # the earlier grid

It rewrites calibration/profiles/h200-measured.json and names the source in the profile's notes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "calibration/profiles/h200-measured.json"


def is_pair_mps(g: dict) -> bool:
    return g["model_a"] == "qwen3-0.6b" and g["model_b"] == "qwen3-32b" and g.get("arrangement") in (None, "mps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="a profile `tr calibrate` wrote")
    a = p.parse_args()
    prof = json.loads(BUNDLED.read_text())
    grid = next(g for g in json.loads(a.source.read_text())["colocation"] if is_pair_mps(g))
    grid.pop("arrangement", None)  # MPS, the default, is written without the key as in the bundled file
    prof["colocation"] = [*(g for g in prof["colocation"] if not is_pair_mps(g)), grid]
    for k in [k for k in prof["notes"] if k.startswith("colocation_20")]:
        del prof["notes"][k]
    src = a.source.resolve().relative_to(ROOT)
    prof["notes"]["colocation"] = (
        f"qwen3-0.6b+qwen3-32b MPS grid from {src} (small model at {grid['batches_a']}, large at {grid['batches_b']} "
        f"tokens; bundled by studies/calibration/bundle_corun.py)"
    )
    BUNDLED.write_text(json.dumps(prof, indent=2) + "\n")
    print(f"{BUNDLED.relative_to(ROOT)}: grid {grid['batches_a']} x {grid['batches_b']} from {src}")


if __name__ == "__main__":
    main()
