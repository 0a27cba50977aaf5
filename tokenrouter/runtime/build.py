"""What one subserver process builds before it serves: its part of the deployment (the simulator's builder), its
engine on the scheduler's pool (rank 0 of `runtime.tp_ranks` when `tp > 1`) and its router."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.core.config import DeploymentConfig, config_from_yaml
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import SyncGate
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.deploy.builder import Deployment, build_deployment
from tokenrouter.runtime.tp_ranks import start_ranks


@dataclass(slots=True)
class SubserverSpec:
    """Everything a subserver process needs (picklable). `memory_gb`: the same in every process, so all derive the
    same pools and the entry's admission ledger matches the peers'."""

    model: int
    config: DeploymentConfig
    addresses: Any  # runtime.addresses.Addresses
    device: str = "cpu"
    memory_gb: float = 1.0
    seed: int = 0
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    stats_interval_s: float = 0.5
    hop_log: str | None = None  # JSONL of this subserver's emits (the launcher merges them: --record-hops)
    step_log: str | None = None  # JSONL of this subserver's steps: launch and done times (monotonic clock)
    prepare_margin_ms: float = 1.0  # overlap: form step k+1 this long before step k's estimated end
    log_level: int = 30  # the launcher's `tokenrouter` logger level (logging.WARNING unless the CLI set one)
    run_dir: str | None = None  # the server's own run directory: removed by a subserver orphaned by a kill -9

    @classmethod
    def from_welcome(cls, model: int, welcome: Any, log_level: int) -> SubserverSpec:
        """The spec of a subserver the launcher did not start (`tr subserver --join`), from its `join.Welcome`."""
        cfg = config_from_yaml(welcome.config_yaml)
        return cls(model, cfg, welcome.addresses, welcome.device, welcome.memory_gb, welcome.seed,
                   dict(welcome.engine_overrides), welcome.stats_interval_s, log_level=log_level)  # fmt: skip


def process_engine_kwargs(spec: SubserverSpec, engine_args: dict[str, Any]) -> dict[str, Any]:
    """This model's engine arguments in its own process: device (`cuda:0`), MPS SM share, then the overrides."""
    kw = dict(engine_args)
    if spec.device == "cpu":
        kw.update(device="cpu", cuda_graphs=False)
    else:
        kw["device"] = "cuda:0"
    share = spec.config.models[spec.model].mps_active_thread_percentage
    if share is not None:
        kw["mps_active_thread_percentage"] = share
    kw.update(spec.engine_overrides)
    return kw


def cpu_threads(num_subservers: int, env: Mapping[str, str] = os.environ, cores: int | None = None) -> int | None:
    """Intra-op threads for one CPU subserver: the host's cores split between the server's subservers (at least one
    each), or None (torch's own choice) where OMP_NUM_THREADS says. Torch's default, every core in every process,
    oversubscribes the host: two tiny-model subservers on two cores measured 10-70x slower with it."""
    if env.get("OMP_NUM_THREADS"):
        return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, num_subservers))


def build_part(spec: SubserverSpec, gate: SyncGate | None) -> tuple[Deployment, Scheduler, Any]:
    """Deployment, this model's scheduler and its engine (router installed, calibrated if `random`)."""
    from tokenrouter.engine import Engine, EngineConfig  # torch: in the subserver process only

    cfg = spec.config
    dep = build_deployment(cfg, gpu_memory_gb=spec.memory_gb, seed=spec.seed, gate=gate)
    model_index = spec.model
    sched = dep.schedulers[model_index]
    kw = process_engine_kwargs(spec, dep.engine_args[model_index])
    tp = cfg.models[model_index].tp > 1
    engine = start_ranks(spec, kw, sched.kv) if tp else Engine(EngineConfig(**kw), kv_pool=sched.kv)
    rc = cfg.router
    if rc.weights:  # a learned router (a torch module)
        from tokenrouter.routers.learned import Calibratable, calibrate_on_runner, make_learned_router

        small = cfg.is_small(model_index)
        module = engine.model  # the torch module of this model: the small one's embedding feeds R2R's classifier
        router = make_learned_router(rc.name, rc.weights, rc.hop_rate, engine.spec.hidden_size, engine.spec.vocab_size,
                                     engine.device, model=model_index, num_models=dep.num_models,
                                     embedding=module.embed_tokens if small else None,
                                     return_prob=rc.return_prob if rc.name == RouterName.R_STITCH else None,
                                     seed=spec.seed)  # fmt: skip
        dep.set_router(model_index, router)
        engine.set_router(sched.router.device)
        if rc.weights.lower() == "random" and isinstance(sched.router, Calibratable):
            calibrate_on_runner(sched.router, engine, seed=spec.seed)
    return dep, sched, engine
