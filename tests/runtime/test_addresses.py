"""The tcp address table (`runtime.addresses`), the config switches that choose it, and the supervision rules of a
subserver the launcher did not start (`runtime.remote`, driven by a fake clock). No processes."""

from __future__ import annotations

import pytest

from tokenrouter.core.config import ConfigError, DeploymentConfig, ModelConfig, PlacementConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses, bind_interface, split_tcp
from tokenrouter.runtime.join import Join
from tokenrouter.runtime.remote import RemoteSubserver


def test_tcp_table_ports_from_a_base_and_bind_forms():
    a = Addresses.tcp("127.0.0.1", ["127.0.0.1", "10.1.2.3", "gpu-node-7"], "*", 7000)
    assert (a.frontend, a.coordinator, a.launcher) == ("tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001",
                                                       "tcp://127.0.0.1:7002")  # fmt: skip
    assert a.subservers == ("tcp://127.0.0.1:7004", "tcp://10.1.2.3:7005", "tcp://gpu-node-7:7006")
    # The launcher's host binds `listen`; another host binds its numeric address, or every interface for a name.
    assert a.bind(a.frontend) == "tcp://*:7000"
    assert a.bind(a.subservers[0]) == "tcp://*:7004"
    assert a.bind(a.subservers[1]) == "tcp://10.1.2.3:7005"
    assert a.bind(a.subservers[2]) == "tcp://*:7006"
    assert bind_interface("::1") == "::1" and bind_interface("example.org") == "*"


def test_port_zero_is_unknown_and_binds_a_free_port():
    a = Addresses.tcp("127.0.0.1", ["127.0.0.1"], "127.0.0.1", None)
    assert not Addresses.known(a.subservers[0])
    assert a.bind(a.subservers[0]) == "tcp://127.0.0.1:*"
    b = a.with_subserver(0, "tcp://127.0.0.1:5555")
    assert Addresses.known(b.subservers[0]) and b.subservers[0] != a.subservers[0]


def test_ipc_is_unchanged_by_bind_and_always_known(tmp_path):
    a = Addresses.local(tmp_path, 2)
    assert a.bind(a.subservers[1]) == a.subservers[1]
    assert all(Addresses.known(x) for x in (a.frontend, a.coordinator, a.launcher, *a.subservers))
    assert a.as_seen_from("10.0.0.1") == a


def test_the_table_seen_from_another_host_renames_only_the_launchers_endpoints():
    a = Addresses.tcp("127.0.0.1", ["127.0.0.1", "10.0.0.9"], "*", 9000)
    seen = a.as_seen_from("10.0.0.1")
    assert seen.frontend == "tcp://10.0.0.1:9000" and seen.launcher == "tcp://10.0.0.1:9002"
    assert seen.subservers == ("tcp://10.0.0.1:9004", "tcp://10.0.0.9:9005")  # model 0 runs beside the launcher
    assert a.as_seen_from("127.0.0.1") == a  # a process on this host keeps loopback


def test_split_tcp_rejects_what_is_not_host_and_port():
    assert split_tcp("tcp://[::1]:80") == ("[::1]", 80)
    for bad in ("ipc:///tmp/x", "tcp://host", "tcp://:80", "tcp://h:port"):
        with pytest.raises(ValueError):
            split_tcp(bad)


def test_transport_follows_host_and_external_and_ipc_refuses_them():
    two = [ModelConfig("tiny-small"), ModelConfig("tiny-large")]
    assert DeploymentConfig(models=two).transport == "ipc"
    assert DeploymentConfig(models=[two[0], ModelConfig("tiny-large", host="h2")]).transport == "tcp"
    assert DeploymentConfig(models=[two[0], ModelConfig("tiny-large", external=True)]).transport == "tcp"
    assert DeploymentConfig(models=two, placement=PlacementConfig(transport="tcp")).transport == "tcp"
    with pytest.raises(ConfigError, match="needs tcp"):
        DeploymentConfig(models=[two[0], ModelConfig("tiny-large", host="h2")],
                         placement=PlacementConfig(transport="ipc"))  # fmt: skip
    with pytest.raises(ConfigError, match="transport"):
        PlacementConfig(transport="udp")
    with pytest.raises(ConfigError, match="port_base"):
        DeploymentConfig(models=two, placement=PlacementConfig(port_base=65_530))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def handle(clock: Clock) -> RemoteSubserver:
    return RemoteSubserver(1, "big", join_timeout_s=30.0, heartbeat_timeout_s=5.0, how_to_start="run-it", clock=clock)


def joined(h: RemoteSubserver) -> None:
    h.on_join(Join(1, "big", "tcp://h2:7005", "h1", 4242, "h2", external=True))


def stats() -> P.Stats:
    return P.Stats(1, 0.0, 0, 10, 0, 0, 0, 0, 0, 0.0, 0, 0)


def test_remote_never_joined_fails_after_the_join_timeout_with_the_command():
    c = Clock()
    h = handle(c)
    c.t += 29.9
    assert h.exitcode is None
    c.t += 0.2
    assert h.exitcode == 1 and "did not join within 30 s" in h.exit_reason and "run-it" in h.exit_reason


def test_remote_heartbeats_keep_it_alive_and_their_absence_fails_it():
    c = Clock()
    h = handle(c)
    joined(h)
    c.t += 1000.0  # joined, building its engine: no heartbeat is due before Ready
    assert h.exitcode is None
    h.on_control(P.Ready(1, "big", 100, 100, 100, 1.0))
    for _ in range(10):
        c.t += 4.0
        h.on_control(stats())
        assert h.exitcode is None
    c.t += 5.1
    assert h.exitcode == 1 and "no heartbeat for 5 s" in h.exit_reason and "pid 4242" in h.exit_reason


def test_remote_failed_and_left_end_it_at_once():
    c = Clock()
    a, b = handle(c), handle(c)
    joined(a)
    joined(b)
    a.on_control(P.Failed(1, "boom"))
    b.on_left()
    assert (a.exitcode, b.exitcode) == (1, 0)
    assert a.exit_reason.startswith("reported a failure") and b.exit_reason.startswith("left")
    b.join(timeout=0)  # returns at once: it left
