"""Put the 2026-12-02 co-location grid (the small model at 1-64, the 32B at 1-64, four MPS splits) into the bundled
profile, in place of the 2026-12-01 grid (the small model at 1-16 only). Everything else stays: the passes (the
same 2026-12-01 measurements), the hand-fitted std-serving costs, and the runtime costs (see README: the re-measured
sync round trips are not bundled).

    python studies/calibration/bundle_2026-12-02.py      # rewrites calibration/profiles/h200-measured.json
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "calibration/profiles/h200-measured.json"
NEW = ROOT / "studies/calibration/h200-2026-12-02.json"


def main() -> None:
    prof = json.loads(BUNDLED.read_text())
    new = json.loads(NEW.read_text())
    grid = next(g for g in new["colocation"] if g["model_a"] == "qwen3-0.6b" and g["model_b"] == "qwen3-32b")
    grid.pop("arrangement", None)  # MPS, the default, is written without the key as in the bundled file
    kept = [g for g in prof["colocation"] if not (g.get("arrangement") is None and g["model_b"] == "qwen3-32b")]
    prof["colocation"] = [*kept, grid]
    prof["notes"]["colocation_2026_12_02"] = (
        "qwen3-0.6b+qwen3-32b MPS grid from studies/calibration/h200-2026-12-02.json (small model at 1, 4, 16, 32, "
        "64; bundled by studies/calibration/bundle_2026-12-02.py)"
    )
    BUNDLED.write_text(json.dumps(prof, indent=2) + "\n")
    print(f"{BUNDLED}: {grid['model_a']}+{grid['model_b']} grid at small batches {grid['batches_a']}")


if __name__ == "__main__":
    main()
