"""Routers usable by both the simulator and the runtime."""

from tokenrouter.routers.presets import router_law, set_hop_rate, synthetic_router
from tokenrouter.routers.synthetic import ProbRouter, TraceRouter

__all__ = ["ProbRouter", "TraceRouter", "router_law", "set_hop_rate", "synthetic_router"]
