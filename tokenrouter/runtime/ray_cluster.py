"""`tr serve --ray ADDRESS`: the subservers as Ray actors in one placement group, model i in bundle i
(docs/cluster.md, Ray); an actor's `run` returning (0) or failing (1) is its exit."""

from __future__ import annotations

import logging
import os
from typing import Any

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.runtime import subserver
from tokenrouter.runtime.addresses import LOOPBACK
from tokenrouter.runtime.logs import configure_logging
from tokenrouter.runtime.remote import RemoteSubserver

log = logging.getLogger(__name__)


class RayUnavailable(ImportError):
    pass


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            '--ray needs Ray, which is not installed here: in the repository, pip install -e ".[ray]"'
        ) from None
    return ray


class SubserverActor:
    """The Ray actor of one subserver (made remote in `RayCluster.start`, so importing this module needs no Ray)."""

    def run(self, spec: Any) -> None:
        configure_logging(spec.log_level)
        subserver.serve(spec, watch_launcher=True)


class RayActorProcess(RemoteSubserver):
    def __init__(self, ray: Any, actor: Any, ref: Any, model: int, name: str, **kw: Any) -> None:
        super().__init__(model, name, **kw)
        self._ray, self.actor, self.ref = ray, actor, ref

    def _check(self) -> None:
        done, _ = self._ray.wait([self.ref], timeout=0)
        if done:
            try:
                self._ray.get(done[0])
                self._exit(0, f"its Ray actor returned ({self.where})")
            except Exception as e:  # RayActorError and friends: the actor or its node died
                self._exit(1, f"its Ray actor died ({self.where}): {type(e).__name__}: {str(e).splitlines()[0]}")
            return
        super()._check()

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self.ref], timeout=timeout)

    def kill(self) -> None:
        self._ray.kill(self.actor, no_restart=True)
        self._exit(1, f"its Ray actor was killed ({self.where})")


class RayCluster:
    """Connects to Ray (an address, `auto`, or `local`: a head here) and reserves one bundle per model."""

    def __init__(self, address: str, config: DeploymentConfig, device: str, *, num_cpus: float = 1.0,
                 timeout_s: float = 120.0) -> None:  # fmt: skip
        ray = self.ray = import_ray()
        from ray.util.placement_group import placement_group, placement_group_table

        self._owns = False
        self.pg = None
        if not ray.is_initialized():
            if address == "local":
                need = int(len(config.models) * num_cpus + 0.999)
                ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False)
            else:
                ray.init(address=address)
            self._owns = True
        gpus = self.gpus = [len(m.gpus) if device == "cuda" else 0 for m in config.models]
        bundles = [{"CPU": num_cpus, **({"GPU": g} if g else {})} for g in gpus]
        self.num_cpus = num_cpus
        try:
            self.pg = placement_group(bundles, strategy="PACK")
            if not self.pg.wait(timeout_s):
                raise RuntimeError(f"Ray could not place {bundles} within {timeout_s:.0f} s; the cluster has "
                                   f"{ray.cluster_resources()}")  # fmt: skip
            table = placement_group_table(self.pg)["bundles_to_node_id"]
            self.nodes = [table[i] for i in range(len(bundles))]
            ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            self.driver_node = ray.get_runtime_context().get_node_id()
            self.driver_ip = ips[self.driver_node]
            self.node_ips = [ips[n] for n in self.nodes]
        except BaseException:
            self.close()
            raise
        where = ", ".join(f"{m.name} -> {ip}" for m, ip in zip(config.models, self.node_ips, strict=True))
        log.info("Ray: %d subserver bundles placed: %s", len(bundles), where)

    @property
    def single_node(self) -> bool:
        """Every actor runs on this process's node (then every endpoint stays on loopback)."""
        return all(n == self.driver_node for n in self.nodes)

    def host(self, model: int) -> str:
        return LOOPBACK if self.single_node else self.node_ips[model]

    def start(self, model: int, spec: Any, **kw: Any) -> RayActorProcess:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = spec.config.models[model].name
        cls = self.ray.remote(SubserverActor).options(
            num_cpus=self.num_cpus, num_gpus=self.gpus[model], max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=model),
        )  # fmt: skip
        actor = cls.remote()
        return RayActorProcess(self.ray, actor, actor.run.remote(spec), model, name, **kw)

    def close(self) -> None:
        """Remove the placement group; disconnect (a head started with `local` stops with it)."""
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
            self.pg = None
        if self._owns:
            self.ray.shutdown()
            self._owns = False
