"""The runtime's own costs on this machine: one peer message (ZeroMQ over ipc:// and tcp loopback, half a round
trip), one round trip to the sync coordinator, and how many a step pays under each sync policy (counted, not timed).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from tokenrouter.runtime.spawn import start_spawned

PAYLOAD = b"x" * 96  # about a peer message of a few tokens (core.wire)


def _echo(pull_addr: str, push_addr: str, n: int) -> None:
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(pull_addr)
    push.connect(push_addr)
    for _ in range(n):
        push.send(pull.recv())
    pull.close(linger=0)
    push.close(linger=1000)
    ctx.term()


def message_ms(transport: str, n: int = 2000) -> float:
    """One-way latency of one small message, ms (median round trip / 2)."""
    import zmq

    with tempfile.TemporaryDirectory(prefix="trcal-") as d:
        if transport == "ipc":
            there, back = f"ipc://{d}/a", f"ipc://{d}/b"
        elif transport == "tcp":
            there, back = (f"tcp://127.0.0.1:{p}" for p in _free_ports(2))
        else:
            raise ValueError(f"transport must be ipc or tcp, got {transport!r}")
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(back)
        push = ctx.socket(zmq.PUSH)
        push.connect(there)
        proc = start_spawned(_echo, (there, back, n + 50), daemon=True)
        try:
            for _ in range(50):  # warm up the connection both ways
                push.send(PAYLOAD)
                pull.recv()
            rtt = []
            for _ in range(n):
                t0 = time.perf_counter()
                push.send(PAYLOAD)
                pull.recv()
                rtt.append(time.perf_counter() - t0)
        finally:
            proc.join(10)
            push.close(linger=0)
            pull.close(linger=0)
            ctx.term()
    return statistics.median(rtt) * 1e3 / 2


def _free_ports(k: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def gate_rtt_ms(n: int = 2000) -> float:
    """One round trip to the sync Coordinator (ipc://), ms (median): a subserver's completion report out, the next
    grant back (`runtime.sync_coordinator`'s complete-and-ask), for a model that is alone in its step-sync rounds."""
    import zmq

    from tokenrouter.core.policy import SyncGate
    from tokenrouter.runtime.sync_coordinator import Coordinator, RemoteGate

    with tempfile.TemporaryDirectory(prefix="trcal-") as d:
        subs = (f"ipc://{d}/s0", f"ipc://{d}/s1")
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)  # model 0's subserver socket, where its grants land
        pull.bind(subs[0])
        coord = Coordinator(SyncGate("step-sync", 2), f"ipc://{d}/gate", subs).start()
        remote = RemoteGate(0, 2, f"ipc://{d}/gate", ctx)
        remote.attach(0, lambda: 1)  # always one request ready: every round is model 0 alone
        try:
            remote.flush()  # the unexplained ready count: an update, answered by the first grant
            times: list[float] = []
            t0 = 0.0
            for i in range(n + 51):
                if not pull.poll(10_000):
                    raise RuntimeError("the coordinator sent no grant within 10 s")
                _, bar = pull.recv_multipart()
                if i > 50:
                    times.append(time.perf_counter() - t0)
                remote.on_grant(bar)
                remote.on_launch(0)
                remote.on_complete(0)
                t0 = time.perf_counter()
                remote.flush()  # the completion report: the ask for the next grant
        finally:
            remote.close()
            pull.close(linger=0)
            coord.stop()
            ctx.term()
    return statistics.median(times) * 1e3


def gate_rtts_per_step(policies: tuple[str, ...] = ("step-sync", "model-sync"), requests: int = 8) -> dict[str, float]:
    """Round trips to the sync coordinator per launched step under each sync policy, counted on the tiny CPU pair:
    the coordinator's `calls` over the grants that launched a step."""
    from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig, RouterConfig, SchedulerConfig
    from tokenrouter.runtime import protocol as P
    from tokenrouter.runtime.client import RuntimeClient
    from tokenrouter.runtime.launcher import Server, with_cpu_kv_tokens

    out: dict[str, float] = {}
    for policy in policies:
        cfg = with_cpu_kv_tokens(DeploymentConfig(
            models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")], policy=PolicyConfig(kind=policy),
            router=RouterConfig("r2r", hop_rate=0.2), scheduler=SchedulerConfig(max_batch_size=16)), 1024)  # fmt: skip
        with Server(cfg) as srv:
            client = RuntimeClient(srv.addresses)
            try:
                sampling = P.Sampling(temperature=0.0, max_tokens=24, ignore_eos=True)
                for k in range(requests):
                    client.submit(f"g{k}", [3 + k, 5, 7, 11], sampling)
                ended: set[str] = set()

                def all_ended(ev: Any, ended: set[str] = ended) -> bool:
                    if isinstance(ev, P.Finished):
                        ended.add(ev.rid)
                    return len(ended) == requests

                client.until(all_ended, 120)
            finally:
                client.close()
            assert srv.coordinator is not None
            settle(srv.coordinator)
            out[policy] = srv.coordinator.calls / max(launched_steps(srv.coordinator.log), 1)
    return out


def settle(coordinator: Any, timeout_s: float = 5.0) -> None:
    """Wait until every grant in a live coordinator's `log` is closed: the last reports may still be on their way
    when the clients have their answers (the log is read again each time: a `CoordinatorProcess` sends a copy)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = list(coordinator.log)
        if sum(e.what == "launch" for e in log) == sum(e.what in ("complete", "release") for e in log):
            return
        time.sleep(0.01)


def launched_steps(log: list[Any]) -> int:
    """Grants that launched a step, from a `Coordinator.log`: grants ("launch") less those handed back ("release")."""
    return sum(1 for e in log if e.what == "launch") - sum(1 for e in log if e.what == "release")


def measure(progress: Any = None) -> dict[str, Any]:
    """Everything above: {"ipc_ms", "tcp_ms", "gate_rtt_ms", "gate_rtts_per_step"}."""
    out: dict[str, Any] = {}
    for key, fn in (("ipc_ms", lambda: message_ms("ipc")), ("tcp_ms", lambda: message_ms("tcp")),
                    ("gate_rtt_ms", gate_rtt_ms), ("gate_rtts_per_step", gate_rtts_per_step)):  # fmt: skip
        out[key] = fn()
        if progress is not None:
            progress()
    return out
