"""Where a deployment's processes listen, `ipc://` or `tcp://` (docs/cluster.md, "Transports"). Invariants: every
endpoint is distinct; `subservers[i]` is model i's PULL; an endpoint with port 0 is never connected to."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, replace
from pathlib import Path

LOOPBACK = "127.0.0.1"
ANY = "*"
# Ports relative to `placement.port_base`; model i's subserver is at base + SUBSERVER_OFFSET + i.
TCP_OFFSETS = {"frontend": 0, "coordinator": 1, "launcher": 2, "submit": 3}
SUBSERVER_OFFSET = 4


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def split_tcp(endpoint: str) -> tuple[str, int]:
    """`tcp://host:port` -> (host, port); IPv6 hosts keep their brackets."""
    if not is_tcp(endpoint):
        raise ValueError(f"not a tcp:// endpoint: {endpoint!r}")
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected tcp://HOST:PORT, got {endpoint!r}")
    return host, int(port)


def tcp_endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    return host == "localhost" or (is_ip(host) and ipaddress.ip_address(host.strip("[]")).is_loopback)


def bind_interface(host: str) -> str:
    """What a process reached at `host` binds: that address when numeric, else every interface (not a DNS name)."""
    return host if is_ip(host) else ANY


def free_tcp_port(interface: str = LOOPBACK) -> int:
    """A port free on `interface` now (racy until bound; `placement.port_base` avoids the window)."""
    with socket.socket(socket.AF_INET6 if ":" in interface else socket.AF_INET) as s:
        s.bind(("" if interface == ANY else interface.strip("[]"), 0))
        return s.getsockname()[1]


def is_local_address(host: str) -> bool:
    """True when `host` resolves to an address of this machine (a socket can bind it)."""
    if is_loopback(host):
        return True
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


@dataclass(frozen=True, slots=True)
class Addresses:
    """The connect addresses of one deployment's endpoints (see the module doc)."""

    frontend: str
    subservers: tuple[str, ...]
    coordinator: str
    launcher: str = ""  # the launcher's PULL: Ready/Stats/Failed, and over tcp the joins
    submit: str = ""  # where clients send Submit/Abort when it is not the entry: the std-serving dispatcher
    listen: str = ""  # tcp only: the interface the launcher's host binds on (`*` or an address)

    def entry_address(self, entry: int) -> str:
        """Where a front-end sends `Submit` and `Abort`."""
        return self.submit or self.subservers[entry]

    @classmethod
    def local(cls, run_dir: str | Path, num_models: int) -> Addresses:
        d = Path(run_dir)
        return cls(frontend=f"ipc://{d / 'frontend'}",
                   subservers=tuple(f"ipc://{d / f'sub{i}'}" for i in range(num_models)),
                   coordinator=f"ipc://{d / 'coordinator'}", launcher=f"ipc://{d / 'launcher'}")  # fmt: skip

    @classmethod
    def tcp(cls, here: str, hosts: list[str], listen: str, port_base: int | None) -> Addresses:
        """Launcher-side endpoints at `here`, model i's at `hosts[i]`; ports from `port_base`, or 0 (to be chosen)."""

        def port(offset: int) -> int:
            return 0 if port_base is None else port_base + offset

        return cls(frontend=tcp_endpoint(here, port(TCP_OFFSETS["frontend"])),
                   subservers=tuple(tcp_endpoint(h, port(SUBSERVER_OFFSET + i)) for i, h in enumerate(hosts)),
                   coordinator=tcp_endpoint(here, port(TCP_OFFSETS["coordinator"])),
                   launcher=tcp_endpoint(here, port(TCP_OFFSETS["launcher"])), listen=listen)  # fmt: skip

    @property
    def here(self) -> str:
        """tcp: the host part that marks an endpoint on the launcher's host (the front-end's)."""
        return split_tcp(self.frontend)[0]

    def bind(self, endpoint: str) -> str:
        """The address the owner of `endpoint` binds (port 0: a free one, read back with `bound_endpoint`)."""
        if not is_tcp(endpoint):
            return endpoint
        host, port = split_tcp(endpoint)
        iface = self.listen if self.listen and host == self.here else bind_interface(host)
        return tcp_endpoint(iface, port) if port else f"tcp://{iface}:*"

    @staticmethod
    def known(endpoint: str) -> bool:
        """False for a tcp endpoint whose port is not chosen yet (nothing may connect to it)."""
        return bool(endpoint) and (not is_tcp(endpoint) or split_tcp(endpoint)[1] != 0)

    def with_subserver(self, model: int, endpoint: str) -> Addresses:
        subs = list(self.subservers)
        subs[model] = endpoint
        return replace(self, subservers=tuple(subs))

    def as_seen_from(self, launcher_host: str) -> Addresses:
        """The table for a process on another host, which reaches the launcher's host at `launcher_host`."""
        if not is_tcp(self.frontend) or is_loopback(launcher_host) or launcher_host == self.here:
            return self
        here = self.here

        def move(endpoint: str) -> str:
            if not is_tcp(endpoint):
                return endpoint
            host, port = split_tcp(endpoint)
            return tcp_endpoint(launcher_host, port) if host == here else endpoint

        return replace(
            self, frontend=move(self.frontend), subservers=tuple(move(a) for a in self.subservers),
            coordinator=move(self.coordinator), launcher=move(self.launcher), submit=move(self.submit),
        )  # fmt: skip


def bound_endpoint(sock: object, endpoint: str) -> str:
    """`endpoint` with the port a socket bound to it actually got (`Addresses.bind` of a port-0 endpoint)."""
    if not is_tcp(endpoint) or split_tcp(endpoint)[1]:
        return endpoint
    import zmq

    last = sock.getsockopt_string(zmq.LAST_ENDPOINT)  # type: ignore[attr-defined]
    return tcp_endpoint(split_tcp(endpoint)[0], split_tcp(last)[1])


def route_address(host: str) -> str:
    """This host's address on the route to `host` (a connected UDP socket's, which sends nothing); OSError if none."""
    if is_loopback(host):
        return LOOPBACK
    try:
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host.strip("[]"), 9))
            return s.getsockname()[0]
    except OSError as e:
        raise OSError(f"cannot find this host's address towards {host} ({e})") from None
