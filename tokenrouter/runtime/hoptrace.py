"""`--record-hops`: merge the subservers' emit logs into the hop trace the simulator replays (docs/routers.md,
"Hop trace format"); a request is written with the tokens that reached the logs, none: left out."""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import groupby
from pathlib import Path


def merge_hop_logs(logs: Iterable[str | Path], out: str | Path) -> int:
    """Write the trace to `out`; returns the number of requests written. Request order: first seen."""
    prompt: dict[str, int] = {}
    emits: dict[str, list[tuple[int, int, int]]] = {}
    for path in logs:
        p = Path(path)
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed process
            rid = e["rid"]
            emits.setdefault(rid, [])
            if "prompt_len" in e:
                prompt[rid] = int(e["prompt_len"])
            else:
                emits[rid].append((int(e["pos"]), int(e["n"]), int(e["model"])))
    n = 0
    with open(out, "w") as f:
        for rid, evs in emits.items():
            runs = [[m, sum(k for _, k, _ in g)] for m, g in groupby(sorted(evs), key=lambda ev: ev[2])]
            if not runs:
                continue
            f.write(json.dumps({"id": rid, "prompt_len": prompt.get(rid, 0), "runs": runs}) + "\n")
            n += 1
    return n
