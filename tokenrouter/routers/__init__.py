"""Routers usable by both the simulator and the runtime."""

from tokenrouter.routers.presets import PRESETS, ensemble, geometric_run, make_preset, one_token_handback
from tokenrouter.routers.synthetic import ProbRouter, TraceRouter

__all__ = [
    "PRESETS",
    "ProbRouter",
    "TraceRouter",
    "ensemble",
    "geometric_run",
    "make_preset",
    "one_token_handback",
]
