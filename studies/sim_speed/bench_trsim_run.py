"""Wall time of `trsim run --hop-rate 0.1` (defaults), as a user runs it: a fresh process each time.

    python studies/sim_speed/bench_trsim_run.py --repeat 5 --out studies/sim_speed/result.json

The requirement is under 10 s on the 2-core CI machine; this prints the median and the spread.
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
    p.add_argument("--out", default=None, help="write a JSON record here")
    args = p.parse_args()
    exe = shutil.which("trsim")
    cmd = [exe] if exe else [sys.executable, "-m", "tokenrouter.cli.trsim"]
    cmd += ["run", "--hop-rate", "0.1"]
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    rec = {
        "command": "trsim run --hop-rate 0.1",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "wall_s": [round(x, 3) for x in times],
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
    }
    print(json.dumps(rec, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
