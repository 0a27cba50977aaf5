"""One deployment builder for the simulator and the runtime (`build_deployment`, pure: no simpy, no torch), and the
one resolver from command-line overrides to a config (`resolve_deployment`)."""

from tokenrouter.deploy.builder import Deployment, build_deployment
from tokenrouter.deploy.engine_args import engine_kwargs
from tokenrouter.deploy.kv_budget import MEM_FRACTION, kv_capacity_tokens
from tokenrouter.deploy.overrides import DeploymentOverrides, resolve_deployment

__all__ = ["MEM_FRACTION", "Deployment", "DeploymentOverrides", "build_deployment", "engine_kwargs",
    "kv_capacity_tokens", "resolve_deployment"]  # fmt: skip
