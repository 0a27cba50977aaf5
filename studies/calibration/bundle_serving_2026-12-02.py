"""Put what the 2026-12-02 serving-loop calibration measured into the bundled profile: the 0.6B's host line
without overlap (the GPU's idle time per step in a real server under step-sync, less the coordinator's round
trips) and the runtime costs of the complete-and-ask sync protocol (1.02 round trips per step, 87 us each). The
32B's host line stays the bare loop's (the serving run had no step of it that followed its own: each came from a
hand-off); the other models' too (not served). Everything else is unchanged. The host line is assembled again
from the run's results with today's rule (`calibration.profiler.assemble.host_costs`; since 2026-12-04 its slope
per row is the bare loop's), so rerunning this follows the rule.

    python studies/calibration/bundle_serving_2026-12-02.py   # rewrites calibration/profiles/h200-measured.json
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from tokenrouter.calibration.profiler.assemble import assemble

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "calibration/profiles/h200-measured.json"
NEW = ROOT / "studies/calibration/serving-2026-12-02/h200-serving.json"
RESULTS = ROOT / "studies/calibration/serving-2026-12-02/call3.partial.json"  # what NEW was assembled from
SERVED = ("qwen3-0.6b",)


def main() -> None:
    prof = json.loads(BUNDLED.read_text())
    new = json.loads(NEW.read_text())
    again = assemble(json.loads(RESULTS.read_text()))
    for name in SERVED:
        prof["models"][name]["host"] = msgspec.to_builtins(again.models[name].host)
    prof["runtime"] = new["runtime"]
    prof["notes"]["serving_loop_2026_12_02"] = (
        "qwen3-0.6b host line and the runtime costs from studies/calibration/serving-2026-12-02/h200-serving.json "
        "(tokenrouter calibrate's serving task; bundled by studies/calibration/bundle_serving_2026-12-02.py)"
    )
    BUNDLED.write_text(json.dumps(prof, indent=2) + "\n")
    for name in SERVED:
        print(f"{BUNDLED}: {name} host {prof['models'][name]['host']}; runtime {prof['runtime']}")


if __name__ == "__main__":
    main()
