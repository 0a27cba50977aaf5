"""A deployment's autotune controller: the core's `AutotuneController` with the Markov solve for its router, and
the co-location factors of its profile when its models share a GPU. The simulator and the runtime's front-end
both build theirs here, from the same deployment config, so both run the same controller with the same solve.
"""

from __future__ import annotations

from tokenrouter.calibration.cost import CostModel, StepCost
from tokenrouter.core.autotune import AutotuneController
from tokenrouter.core.config import AutotuneConfig, DeploymentConfig
from tokenrouter.core.policy import Policy
from tokenrouter.deploy.placement import colocated
from tokenrouter.markov.autotune_solve import CoRun, MarkovSolver
from tokenrouter.routers.presets import router_law


def make_controller(dep: DeploymentConfig, config: AutotuneConfig | None = None,
                    policy: Policy | None = None, cost: StepCost | None = None) -> AutotuneController:  # fmt: skip
    """The controller of a deployment: its `policy.autotune` settings (or `config`), its policy in force (or
    `policy`), the Markov solve for its router, with co-location factors from `cost` (the simulator passes its cost
    model; default: the deployment's profile). ValueError when the deployment cannot be autotuned."""
    cfg = config or dep.policy.autotune or AutotuneConfig()
    rc, m = dep.router, len(dep.models)
    law = router_law(rc, m)
    p, q = (law.routing[0][1], law.routing[1][0]) if m == 2 else (rc.hop_rate, rc.return_prob)
    solver = MarkovSolver(str(rc.name), m, p, q, cfg.max_states, corun=corun_of(dep, cost))
    return AutotuneController(cfg, policy or dep.policy.build(), solver, law.drops_token)


def corun_of(dep: DeploymentConfig, cost: StepCost | None = None) -> CoRun | None:
    """The co-location factors (`cost`'s, else the deployment profile's) of a deployment whose models share a GPU
    under MPS; None when none do or the profile cannot price the pair (autotune then solves on the measured step
    times as they are)."""
    peers = [colocated(dep, i) for i in range(len(dep.models))]
    if not any(peers):
        return None
    try:
        if cost is None:
            cost = CostModel(dep.profile, dep.placement.mode, models=[m.name for m in dep.models],
                             shares=[m.mps_active_thread_percentage for m in dep.models])  # fmt: skip
        inter = [cost.interference(i, p[0]) if p else None for i, p in enumerate(peers)]
    except (ValueError, KeyError):  # ProfileError and ColocationError are ValueErrors
        return None
    return CoRun([None if f is None else f.mixed for f in inter])
