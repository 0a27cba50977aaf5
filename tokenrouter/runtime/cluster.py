"""The launcher's side of a tcp deployment (docs/cluster.md): `Cluster` owns the address table, where a subserver's
endpoint is port 0 until it joined; a restarted subserver binds the endpoint it had."""

from __future__ import annotations

import logging
import shlex
import socket
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

import zmq

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.runtime import addresses as A
from tokenrouter.runtime import join as J
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.build import SubserverSpec
from tokenrouter.runtime.ray_cluster import RayCluster
from tokenrouter.runtime.remote import RemoteSubserver
from tokenrouter.runtime.sockets import send_once
from tokenrouter.runtime.supervision import StartupError, exit_reason

log = logging.getLogger(__name__)

UNJOINED = "unjoined"  # host placeholder of an external model without `host` (port 0: never connected to)


@dataclass(slots=True)
class ClusterOptions:
    """`ray`: a Ray address, `auto`, or `local` (start a head here); None: no Ray. `heartbeat_timeout_s`: for the
    subservers the launcher did not start. `config_path`: only for the printed command of an external model."""

    ray: str | None = None
    heartbeat_timeout_s: float = 10.0
    join_timeout_s: float = 300.0
    ray_num_cpus: float = 1.0
    config_path: str | None = None

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_s <= 0 or self.join_timeout_s <= 0 or self.ray_num_cpus <= 0:
            raise ValueError("heartbeat_timeout_s, join_timeout_s and ray_num_cpus must be > 0")


class Launcher(Protocol):
    """What `Cluster` reads of its launcher (`runtime.launcher.Server`)."""

    config: DeploymentConfig
    device: str
    stats_interval_s: float
    restart_on_failure: bool
    processes: list[Any]
    dead: dict[int, str]

    def poll_control(self, timeout_ms: int) -> None: ...

    def serving(self) -> bool: ...


class Cluster:
    def __init__(self, launcher: Launcher, options: ClusterOptions, ctx: zmq.Context) -> None:
        """`ctx`: the launcher's ZeroMQ context (the Welcome and Refused frames go out on sockets of it)."""
        cfg = launcher.config
        self.config, self.options = cfg, options
        self.names = [m.name for m in cfg.models]
        pl = cfg.placement
        remote = bool(options.ray) or any(m.external for m in cfg.models)
        if remote and launcher.stats_interval_s * 2 > options.heartbeat_timeout_s:
            raise ValueError(f"the heartbeat timeout ({options.heartbeat_timeout_s} s) must be at least twice the "
                             f"Stats interval ({launcher.stats_interval_s} s)")  # fmt: skip
        if launcher.restart_on_failure and pl.port_base is None and any(m.external for m in cfg.models):
            raise ValueError("restarting an external subserver in place needs fixed ports (placement.port_base): "
                             "its peers must find it where it was")  # fmt: skip
        for m in cfg.models:
            if not m.external and not options.ray and m.host and not A.is_local_address(m.host):
                raise ValueError(f"model {m.name}: host {m.host} is not an address of this host; mark it "
                                 "external: true and start it there (`tokenrouter subserver --join ...`)")  # fmt: skip
        self.ray = None
        if options.ray:
            if any(m.external for m in cfg.models):
                raise ValueError("--ray starts every model as an actor; external: true is for a model started by hand")
            if launcher.device == "cuda" and pl.mode == "mps":
                raise ValueError("--ray gives each model its own GPUs: use placement separate or cross-host, not mps")
            self.ray = RayCluster(options.ray, cfg, launcher.device, num_cpus=options.ray_num_cpus)
        self.local = self._is_local()
        listen = self._listen()
        here = self.here = A.LOOPBACK if listen in (A.LOOPBACK, A.ANY) else listen
        # Where each subserver is asked to listen (port from port_base, else 0: free).
        self.intended = [A.tcp_endpoint(self._host(i, here), self._port(i)) for i in range(len(cfg.models))]
        hosts = [A.split_tcp(a)[0] for a in self.intended]
        table = Addresses.tcp(here, hosts, listen, pl.port_base)
        table = replace(table, subservers=tuple(A.tcp_endpoint(h, 0) for h in hosts))
        if pl.port_base is None:
            table = replace(table, frontend=A.tcp_endpoint(here, A.free_tcp_port(listen)),
                            coordinator=A.tcp_endpoint(here, A.free_tcp_port(listen)))  # fmt: skip
        self.addresses = table
        self.joins: dict[int, J.Join] = {}
        self.specs: dict[int, SubserverSpec] = {}  # model -> the spec it last started with (its Welcome says it)
        self.open = False  # every model joined and the table went out: later joins are welcomed at once
        self.launcher, self.ctx = launcher, ctx

    def _is_local(self) -> bool:
        if self.ray is not None:
            return self.ray.single_node
        # An external model on a loopback host is started by hand on this host: still local.
        return all(A.is_loopback(m.host) if m.host else not m.external for m in self.config.models)

    def _listen(self) -> str:
        lh = self.config.placement.launcher_host
        if lh is not None:
            return lh if A.is_ip(lh) else A.ANY
        return A.LOOPBACK if self.local else A.ANY

    def _host(self, i: int, here: str) -> str:
        m = self.config.models[i]
        if self.ray is not None:
            return self.ray.host(i)
        if m.external:
            return m.host or UNJOINED
        return m.host if m.host and not A.is_loopback(m.host) else here

    def _port(self, i: int) -> int:
        base = self.config.placement.port_base
        return 0 if base is None else base + A.SUBSERVER_OFFSET + i

    def bind_launcher(self, sock: zmq.Socket) -> Addresses:
        a = self.addresses
        sock.bind(a.bind(a.launcher))
        self.addresses = replace(a, launcher=A.bound_endpoint(sock, a.launcher))
        return self.addresses

    def join_command(self, i: int) -> str:
        cfg = self.options.config_path or "DEPLOYMENT.yaml"
        at = self.config.placement.launcher_host or (A.LOOPBACK if self.local else socket.getfqdn())
        port = A.split_tcp(self.addresses.launcher)[1]
        return (f"tokenrouter subserver --config {shlex.quote(cfg)} --model {shlex.quote(self.names[i])} "
                f"--join tcp://{at}:{port}")  # fmt: skip

    def prepare(self, i: int, spec: SubserverSpec) -> SubserverSpec:
        """The spec model i starts with: the table as seen from its host, with the endpoint it must bind."""
        self.specs[i] = spec
        own = self.addresses.subservers[i]
        if not Addresses.known(own):
            own = self.intended[i]
        seen = self.addresses
        if self.ray is not None and not self.local:
            seen = seen.as_seen_from(self.ray.driver_ip)
        return replace(spec, addresses=seen.with_subserver(i, own), run_dir=None if self.ray else spec.run_dir)

    def start_remote(self, i: int, spec: SubserverSpec) -> RemoteSubserver | None:
        """A handle for a subserver the launcher does not start as its child (None: spawn it as usual)."""
        kw: dict[str, Any] = dict(join_timeout_s=self.options.join_timeout_s,
                                  heartbeat_timeout_s=self.options.heartbeat_timeout_s)  # fmt: skip
        if self.ray is not None:
            return self.ray.start(i, spec, **kw)
        if self.config.models[i].external:
            cmd = self.join_command(i)
            log.warning("waiting for model %d (%s) to join: start it on its host with: %s", i, self.names[i], cmd)
            return RemoteSubserver(i, self.names[i], how_to_start=cmd, **kw)
        return None

    def wait_joined(self) -> None:
        """Until every subserver joined (`StartupError` when one failed, or after `join_timeout_s`)."""
        srv = self.launcher
        deadline = time.monotonic() + self.options.join_timeout_s
        while len(self.joins) < len(self.names):
            srv.poll_control(100)
            for i, p in enumerate(srv.processes):
                if i not in self.joins and p.exitcode is not None:
                    why = srv.dead.get(i) or exit_reason(p)
                    raise StartupError(f"subserver {i} ({self.names[i]}) failed during start-up: {why}")
            if time.monotonic() > deadline:
                missing = ", ".join(self.names[i] for i in range(len(self.names)) if i not in self.joins)
                raise StartupError(f"{missing} did not join within {self.options.join_timeout_s:.0f} s")
        log.info("every subserver joined: %s", ", ".join(self.addresses.subservers))

    def welcome_all(self) -> None:
        self.open = True
        for i in sorted(self.joins):
            self._welcome(self.joins[i])

    def on_join(self, data: bytes) -> Addresses:
        """A JOIN frame on the launcher's socket; the table, with the endpoint of a subserver that joined."""
        msg = J.decode(data)
        procs = self.launcher.processes
        handle = procs[msg.model] if isinstance(msg, J.Join | J.Left) and msg.model < len(procs) else None
        if isinstance(msg, J.Left):
            if isinstance(handle, RemoteSubserver):
                handle.on_left()
            return self.addresses
        if not isinstance(msg, J.Join):
            return self.addresses
        why = self._refusal(msg, handle)
        if why is not None:
            log.error("refused a join for model %d (%s) from %s: %s", msg.model, msg.name, msg.endpoint, why)
            self._send(msg.endpoint, J.Refused(msg.model, why))
            return self.addresses
        if isinstance(handle, RemoteSubserver):
            handle.on_join(msg)
        self.joins[msg.model] = msg
        self.addresses = self.addresses.with_subserver(msg.model, msg.endpoint)
        log.info("model %d (%s) joined from %s (host %s, pid %d)", msg.model, msg.name, msg.endpoint, msg.hostname,
                 msg.pid)  # fmt: skip
        if self.open:
            self._welcome(msg)
        return self.addresses

    def _refusal(self, msg: J.Join, handle: Any) -> str | None:
        n = len(self.names)
        if not 0 <= msg.model < n or self.names[msg.model] != msg.name:
            return f"this deployment's model {msg.model} is {self.names[msg.model] if msg.model < n else 'absent'}"
        if msg.external and msg.models != self.names:
            return f"the deployment differs: this launcher serves {self.names}, the joiner's config {msg.models}"
        if msg.external != self.config.models[msg.model].external or (msg.external and self.ray is not None):
            return "the launcher starts this model itself (external: false in its config)"
        if not self.launcher.serving():
            return "the server is stopping"
        old = self.joins.get(msg.model)
        if old is not None and (old.pid, old.hostname) != (msg.pid, msg.hostname):
            if handle is not None and handle.exitcode is None and isinstance(handle, RemoteSubserver) \
                    and handle.joined is not None:  # fmt: skip
                return f"already joined from {old.hostname} (pid {old.pid})"
            if old.endpoint != msg.endpoint:
                return (f"a restarted subserver must listen where it did ({old.endpoint}); it listens on "
                        f"{msg.endpoint} (set placement.port_base)")  # fmt: skip
        return None

    def _welcome(self, join: J.Join) -> None:
        spec = self.specs[join.model]
        seen = self.addresses.as_seen_from(self.config.placement.launcher_host or join.via)
        self._send(join.endpoint, J.Welcome(
            join.model, seen.frontend, list(seen.subservers), seen.coordinator, seen.launcher, seen.submit,
            config_yaml=self.config.to_yaml() if join.external else "", device=spec.device, memory_gb=spec.memory_gb,
            seed=spec.seed, engine_overrides=dict(spec.engine_overrides), stats_interval_s=spec.stats_interval_s,
            log_level=spec.log_level))  # fmt: skip

    def _send(self, endpoint: str, msg: J.JoinMessage) -> None:
        send_once(self.ctx, endpoint, [P.JOIN, J.encode(msg)])

    def on_control(self, msg: P.Ready | P.Stats | P.Failed) -> None:
        """A listener of the launcher: heartbeats and failures for the handles of remote subservers."""
        procs = self.launcher.processes
        if 0 <= msg.model < len(procs) and isinstance(procs[msg.model], RemoteSubserver):
            procs[msg.model].on_control(msg)

    def close(self) -> None:
        if self.ray is not None:
            self.ray.close()
