"""One deployment builder, used by the simulator now and the runtime next: config -> routers, KV pools,
schedulers, sync gate, admission, graph rules, engine settings and message wiring (pure: no simpy, no torch).
"""

from tokenrouter.deploy.builder import Deployment, build_deployment, build_router
from tokenrouter.deploy.engine_args import engine_kwargs
from tokenrouter.deploy.kv_budget import MEM_FRACTION, joint_kv_tokens, kv_capacity_tokens

__all__ = [
    "MEM_FRACTION",
    "Deployment",
    "build_deployment",
    "build_router",
    "engine_kwargs",
    "joint_kv_tokens",
    "kv_capacity_tokens",
]
