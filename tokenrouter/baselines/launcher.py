"""`BaselineServer`: the launcher running a baseline's processes instead of the routed subservers (docs/baselines.md,
section 2); any process that dies stops the server (a baseline is a measurement)."""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenrouter.baselines import dispatcher, model_server
from tokenrouter.baselines.modes import BASELINES, baseline_config
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.runtime.build import SubserverSpec
from tokenrouter.runtime.launcher import Server

log = logging.getLogger(__name__)


class BaselineServer(Server):
    """`config` is the routed deployment; `mode` one of `BASELINES`; `Server`'s keyword arguments (std-serving:
    `record_hops` from the dispatcher, `step_logs` also keeps its per-visit log)."""

    def __init__(self, config: DeploymentConfig, mode: str = "std-serving", **kw: Any) -> None:
        if mode not in BASELINES:
            raise ValueError(f"unknown baseline {mode!r}; choose one of {', '.join(BASELINES)}")
        if kw.get("restart_on_failure"):
            raise ValueError("a baseline does not restart a process in place (--restart-on-failure)")
        self.mode = mode
        if config.transport == "tcp" or kw.get("cluster") is not None:
            raise ValueError("a baseline runs every process on one host over ipc (placement.transport tcp, a model's "
                             "host or external, and --ray are for the routed runtime)")  # fmt: skip
        cfg = baseline_config(config, mode)
        if mode == "std-serving":  # refuse a router standard serving cannot run, before any process starts
            dispatcher.build_routers(cfg, kw.get("seed", 0))
        super().__init__(cfg, **kw)
        if mode == "std-serving":
            self.addresses = replace(self.addresses, submit=f"ipc://{self.run_dir / 'dispatcher'}")

    def visit_log(self) -> Path:
        return self.step_log_dir / "visits.jsonl"

    def subserver_target(self, spec: SubserverSpec) -> tuple[Callable[[Any], None], Any]:
        if self.mode == "std-serving":
            spec = replace(spec, hop_log=None)  # the dispatcher records the trace: per client request, not per visit
        reply = self.addresses.submit or self.addresses.frontend
        return model_server.main, model_server.ModelServerSpec(spec, reply)

    def hop_logs(self) -> list[Path]:
        return [self._trace_log()] if self.mode == "std-serving" else super().hop_logs()

    def start_aux(self) -> None:
        if self.mode != "std-serving":
            return
        spec = dispatcher.DispatcherSpec(self.config, self.addresses, self.seed,
                                         logging.getLogger("tokenrouter").getEffectiveLevel(),
                                         hop_log=str(self.visit_log()) if self.step_logs else None,
                                         trace_log=str(self._trace_log()) if self.record_hops else None)  # fmt: skip
        p = mp.get_context("spawn").Process(target=dispatcher.main, args=(spec,), name="tokenrouter-dispatch")
        p.start()
        self.aux.append(("the std-serving dispatcher", p, self.addresses.submit))

    def _trace_log(self) -> Path:
        return self.run_dir / "dispatch-trace.jsonl"
