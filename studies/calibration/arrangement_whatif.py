"""What if the pair ran in one process with stream priority (or green contexts) instead of MPS? The runtime has no
one-process placement, so this asks the simulator: the measured profile with its MPS 100/100 co-run grid replaced
by an arrangement's grid (same batches), the same cells otherwise.

    python studies/calibration/arrangement_whatif.py
"""

from __future__ import annotations

import msgspec

from tokenrouter.calibration import load_profile
from tokenrouter.deploy import DeploymentOverrides, resolve_deployment
from tokenrouter.sim.run import SimConfig, run_sim


def with_arrangement(name: str):
    prof = load_profile("h200-measured")
    grids = []
    for g in prof.colocation:
        if g.arrangement == "mps" and (g.model_a, g.model_b) == ("qwen3-0.6b", "qwen3-32b"):
            alt = next(x for x in prof.colocation if x.arrangement == name and x.model_a == g.model_a)
            # the arrangement's grid whole (its own batch axes and references), priced where the MPS grid was
            grids.append(msgspec.structs.replace(alt, arrangement="mps"))
        elif g.arrangement == "mps":
            grids.append(g)
    return msgspec.structs.replace(prof, colocation=grids)


def main() -> None:
    cells = [(8, [1, 6]), (8, [1, 1]), (16, [1, 12]), (4, [1, 4])]
    profiles = {"mps 100/100": load_profile("h200-measured"), "stream-priority": with_arrangement("stream-priority"),
                "green-context": with_arrangement("green-context")}  # fmt: skip
    print("N  B      " + "  ".join(f"{k:>16s}" for k in profiles))
    for n, b in cells:
        out = []
        for prof in profiles.values():
            dep = resolve_deployment(None, DeploymentOverrides(hop_rate=0.1, thresholds=b, max_batch_tokens=2048))
            from tokenrouter.sim.run import cost_model

            cfg = SimConfig(dep, concurrency=n, num_requests=max(8, 3 * n), max_output=256)
            cfg.cost = cost_model(dep, prof)
            out.append(run_sim(cfg).summary["output_throughput_tok_s"])
        print(f"{n:<2d} {','.join(map(str, b)):6s} " + "  ".join(f"{x:16,.0f}" for x in out))


if __name__ == "__main__":
    main()
