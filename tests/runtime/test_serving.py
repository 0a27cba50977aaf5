"""The runtime on CPU: two subserver processes (tiny pair, dummy weights), real ZeroMQ sockets, driven by a raw
client that binds the front-end PULL itself (no HTTP)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from rt_helpers import GREEDY, alive, collect, tiny_config, wait_stats

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    d = tmp_path_factory.mktemp("eager")
    srv = Server(tiny_config(), run_dir=d, record_hops=d / "trace.jsonl", stats_interval_s=0.05).start()
    client = RuntimeClient(srv.addresses)
    yield srv, client, d
    client.close()
    pids = [p.pid for p in srv.processes]
    srv.stop()
    assert not any(alive(p) for p in pids)  # stop leaves nothing running


def test_every_request_completes_with_hops_and_parked_kv(eager):
    _srv, client, _d = eager
    n, prompts = 8, {f"a{k}": [3 + k, 40, 41, 42 + k, 7] for k in range(8)}
    for rid, p in prompts.items():
        client.submit(rid, p, GREEDY)
    stats: list[P.Stats] = []
    out = collect(client, set(prompts), stats=stats)
    for rid, o in out.items():
        assert isinstance(o.end, P.Finished) and o.end.reason == "length", (rid, o.end)
        assert o.dup == 0 and sorted(o.tokens) == list(range(GREEDY.max_tokens))  # positions 0..n-1, once each
        assert o.end.num_output == GREEDY.max_tokens
    writers = [m for o in out.values() for _, m in o.tokens.values()]
    assert writers.count(1) > 0 and writers.count(0) > 0  # r2r at 0.3: both models wrote
    assert sum(o.end.num_hops for o in out.values()) > 0
    entry = [s for s in stats if s.model == 0]
    # A request parked on the peer keeps its pages on the entry: pages used never drop below the parked count.
    assert all(s.kv_pages_used >= s.pending for s in entry)
    assert any(s.pending > 0 for s in entry) or n == 0
    idle = wait_stats(client, lambda st: all(s.kv_pages_used == 0 and s.running == 0 for s in st.values()))
    assert all(s.kv_pages_total > 0 for s in idle.values())


def test_abort_frees_pages(eager):
    _srv, client, _ = eager
    long = P.Sampling(temperature=0.0, max_tokens=200, ignore_eos=True)
    client.submit("ab", [1, 2, 3, 4, 5, 6], long)
    client.until(lambda ev: isinstance(ev, P.Tokens) and ev.rid == "ab", 30)
    wait_stats(client, lambda st: st[0].kv_pages_used > 0 or st[1].kv_pages_used > 0)
    client.abort("ab")
    end = client.until(lambda ev: isinstance(ev, P.Finished) and ev.rid == "ab", 30)[-1]
    assert end.reason == "abort" and end.num_output < 200
    wait_stats(client, lambda st: all(s.kv_pages_used == 0 and s.running + s.waiting + s.pending == 0
                                      for s in st.values()))  # fmt: skip


def test_too_long_and_bad_input_rejected(eager):
    srv, client, _ = eager
    cap = srv.ready[0].kv_capacity_tokens
    client.submit("big", list(range(1, 50)) * (cap // 49 + 1), GREEDY)
    client.submit("oov", [1, 5000], GREEDY)
    client.submit("zero", [1, 2], P.Sampling(max_tokens=0))
    got: dict[str, P.Rejected] = {}

    def rejected(ev: P.ToFrontend) -> bool:
        if isinstance(ev, P.Rejected):
            got[ev.rid] = ev
        return len(got) == 3

    client.until(rejected, 20)
    assert {r: e.status for r, e in got.items()} == {"big": 400, "oov": 400, "zero": 400}
    client.submit("after", [9, 9, 9], GREEDY)  # the server keeps serving
    assert collect(client, {"after"})["after"].end.reason == "length"


def test_record_hops_trace(eager):
    """Last test on the shared server: stop it, and the merged hop trace has the runs the client saw."""
    srv, client, d = eager
    client.submit("tr", [11, 12, 13], GREEDY)
    seen = collect(client, {"tr"})["tr"]
    time.sleep(0.3)
    srv.stop()
    lines = [json.loads(x) for x in (d / "trace.jsonl").read_text().splitlines()]
    rec = next(x for x in lines if x["id"] == "tr")
    writers = [seen.tokens[k][1] for k in sorted(seen.tokens)]
    runs = []
    for m in writers:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    assert rec == {"id": "tr", "prompt_len": 3, "runs": runs}


def test_killed_subserver_is_reported(tmp_path):
    srv = Server(tiny_config(), run_dir=tmp_path).start()
    client = RuntimeClient(srv.addresses)
    try:
        pid = srv.processes[1].pid
        t0 = time.monotonic()
        import os

        os.kill(pid, signal.SIGKILL)
        ev = client.until(lambda e: isinstance(e, P.Failed), 10)[-1]
        assert ev.model == 1 and time.monotonic() - t0 < 5
        assert not srv.healthy() and 1 in srv.dead
    finally:
        client.close()
        pids = [p.pid for p in srv.processes]
        srv.stop()
    assert not any(alive(p) for p in pids)
