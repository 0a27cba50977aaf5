"""`run_sim`: one simulated run (`sim.loop`), with autotune's controller when the deployment asks for it. The
simulator's types are re-exported here, where the commands and studies import them.
"""

from __future__ import annotations

from tokenrouter.sim.autotune_solve import make_controller
from tokenrouter.sim.loop import SimConfig, SimResult, cost_model, estimated_notes, prepare_sim, simulate_config

__all__ = ["SimConfig", "SimResult", "cost_model", "estimated_notes", "prepare_sim", "run_sim"]


def run_sim(cfg: SimConfig) -> SimResult:
    """Simulate `cfg` (the module docstring)."""
    return simulate_config(cfg, make_controller if cfg.deployment.policy.autotune is not None else None)
