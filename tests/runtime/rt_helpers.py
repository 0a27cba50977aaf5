"""Helpers for the runtime tests: a tiny CPU deployment in real processes, a raw ZeroMQ client that binds the
front-end socket itself, and a collector that checks every request's output positions."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")

from tokenrouter.core.config import (
    DeploymentConfig,
    ModelConfig,
    PolicyConfig,
    RouterConfig,
    SchedulerConfig,
)
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import with_cpu_kv_tokens


def tiny_config(policy: str = "eager", router: str = "r2r", hop_rate: float = 0.3, weights: str | None = None,
                overlap: bool = True, kv_tokens: int = 1024) -> DeploymentConfig:  # fmt: skip
    cfg = DeploymentConfig(
        models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
        policy=PolicyConfig(kind=policy),
        router=RouterConfig(router, hop_rate=hop_rate, weights=weights),
        scheduler=SchedulerConfig(max_batch_size=16, overlap=overlap, kv_growth_tokens=64),
    )
    return with_cpu_kv_tokens(cfg, kv_tokens)


@dataclass
class Outcome:
    """What the front-end saw for one request."""

    tokens: dict[int, tuple[int, int]] = field(default_factory=dict)  # pos -> (token, model)
    dup: int = 0
    end: P.Finished | P.Rejected | None = None

    def ids(self) -> list[int]:
        return [self.tokens[k][0] for k in sorted(self.tokens)]


def collect(client: RuntimeClient, rids: set[str], timeout_s: float = 45.0,
            stats: list[P.Stats] | None = None) -> dict[str, Outcome]:  # fmt: skip
    """Receive until every request in `rids` ended and, for a `Finished`, every position below its `num_output`
    arrived (tokens come from whichever subserver committed them, on another socket than the `Finished`, so
    the last ones may land after it); raises TimeoutError (a hang, or a lost token) otherwise."""
    out = {r: Outcome() for r in rids}

    def step(ev: P.ToFrontend) -> bool:
        if isinstance(ev, P.Tokens):
            o = out[ev.rid]
            for k, t in enumerate(P.unpack_ids(ev.ids)):
                o.dup += (ev.pos + k) in o.tokens
                o.tokens[ev.pos + k] = (t, ev.model)
        elif isinstance(ev, (P.Finished, P.Rejected)) and ev.rid in out:
            out[ev.rid].end = ev
        elif isinstance(ev, P.Stats) and stats is not None:
            stats.append(ev)
        elif isinstance(ev, P.Failed):
            raise AssertionError(f"subserver failed: {ev}")
        return all(_complete(o) for o in out.values())

    client.until(step, timeout_s)
    return out


def _complete(o: Outcome) -> bool:
    if o.end is None:
        return False
    return not isinstance(o.end, P.Finished) or all(k in o.tokens for k in range(o.end.num_output))


def wait_stats(client: RuntimeClient, pred, timeout_s: float = 15.0) -> dict[int, P.Stats]:
    """Latest Stats per model once `pred(latest)` holds for them."""
    latest: dict[int, P.Stats] = {}

    def step(ev: P.ToFrontend) -> bool:
        if isinstance(ev, P.Stats):
            latest[ev.model] = ev
            return len(latest) == 2 and pred(latest)
        return False

    client.until(step, timeout_s)
    return latest


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


GREEDY = P.Sampling(temperature=0.0, max_tokens=10, ignore_eos=True)


def serves_on_and_drains(client: RuntimeClient, srv) -> None:
    """After a fault the server serves on: a new request completes, the server is healthy, and every model ends
    holding no KV page and no request."""
    client.submit("after", [9, 9, 9], GREEDY)
    after = collect(client, {"after"})["after"]
    assert after.end.reason == "length" and sorted(after.tokens) == list(range(GREEDY.max_tokens))
    assert srv.healthy()
    wait_stats(client, lambda st: all(s.kv_pages_used == 0 and s.running + s.waiting + s.pending == 0
                                      for s in st.values()))  # fmt: skip


def stop_and_check_gone(client: RuntimeClient, srv) -> None:
    """Close the client, stop the server, and check that none of its processes outlives it."""
    client.close()
    pids = [p.pid for p in srv.processes]
    srv.stop()
    assert not any(alive(p) for p in pids)
