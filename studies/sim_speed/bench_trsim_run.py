"""Wall time of `trsim run --hop-rate 0.1` (defaults, the choice of B included), as a user runs it: a fresh process
each time; with `--tune`, also of `trsim tune -n 1,2,4,8,16,32,64`.

    python studies/sim_speed/bench_trsim_run.py --repeat 5 --tune 1 --out studies/sim_speed/result.json

The requirements are 3 s and 60 s on 2 cores; this prints the median and the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tune", type=int, default=0, help="also time trsim tune -n 1..64 this many times")
    p.add_argument("--out", default=None, help="write a JSON record here")
    args = p.parse_args()
    exe = shutil.which("trsim")
    base = [exe] if exe else [sys.executable, "-m", "tokenrouter.cli.trsim"]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    rec = {"date": date.today().isoformat(), "machine": machine, "loadavg_before": os.getloadavg()[0],
           "runs": [timed(base, ["run", "--hop-rate", "0.1"], args.repeat)]}  # fmt: skip
    if args.tune:
        out = "/tmp/bench_trsim_tune.yaml"
        rec["runs"].append(timed(base, ["tune", "-n", "1,2,4,8,16,32,64", "-o", out], args.tune))
    print(json.dumps(rec, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=2)
            f.write("\n")


def timed(base: list[str], argv: list[str], repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([*base, *argv], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return {"command": "trsim " + " ".join(argv), "wall_s": [round(x, 3) for x in times],
            "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}  # fmt: skip


if __name__ == "__main__":
    main()
