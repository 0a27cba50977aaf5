"""`models[1].tp: 2` on CPU (gloo): the large model's subserver is rank 0 and starts rank 1 itself. Served end to end
with a hop trace (the writer of every position is fixed), it must write exactly the tokens of the same deployment
at tp 1; a clean stop leaves no rank; a rank that dies fails the server (the launcher's supervision sees it), and
the death of rank 0 takes its follower with it."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import replace
from pathlib import Path

import psutil
from rt_helpers import GREEDY, alive, collect, tiny_config

from tokenrouter.core.config import DeploymentConfig, RouterConfig
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server

PROMPTS = {f"p{k}": [5 + k, 40, 41 + 3 * k, 300, 7, 11 + k] for k in range(4)}
LONG = P.Sampling(temperature=0.0, max_tokens=24, ignore_eos=True)


def _trace(path: Path) -> None:
    """Every request hops to the large model several times, for runs of one to three tokens."""
    rng = random.Random(5)
    with path.open("w") as f:
        for rid, prompt in PROMPTS.items():
            runs, left, m = [], LONG.max_tokens, 0
            while left:
                n = min(left, rng.randint(1, 3) if m else rng.randint(2, 5))
                runs.append([m, n])
                left, m = left - n, 1 - m
            f.write(json.dumps({"id": rid, "prompt_len": len(prompt), "runs": runs}) + "\n")


def _config(tmp: Path, tp: int) -> DeploymentConfig:
    cfg = tiny_config("eager")
    cfg = replace(cfg, router=RouterConfig("trace", trace=str(tmp / "trace.jsonl")))
    return replace(cfg, models=[cfg.models[0], replace(cfg.models[1], tp=tp)])


def _followers(srv: Server) -> list[int]:
    """Pids of the large model's ranks 1.. (children of its subserver process)."""
    return [c.pid for c in psutil.Process(srv.processes[1].pid).children() if c.name() != "resource_tracker"]


def _serve(cfg: DeploymentConfig, run_dir: Path) -> tuple[dict, list[int], list[int]]:
    """Serve PROMPTS, stop cleanly; (outcomes, the followers seen while serving, processes alive after stop)."""
    srv = Server(cfg, run_dir=run_dir).start()
    client = RuntimeClient(srv.addresses)
    followers: list[int] = []
    try:
        followers = _followers(srv)
        for rid, p in PROMPTS.items():
            client.submit(rid, p, LONG)
        out = collect(client, set(PROMPTS), timeout_s=90)
    finally:
        client.close()
        pids = [p.pid for p in srv.processes] + followers
        srv.stop()
    return out, followers, [p for p in pids if alive(p)]


def test_tp2_serves_the_tokens_of_tp1_and_stops_whole(tmp_path):
    _trace(tmp_path / "trace.jsonl")
    ref, none, _ = _serve(_config(tmp_path, 1), tmp_path / "tp1")
    got, followers, left = _serve(_config(tmp_path, 2), tmp_path / "tp2")
    assert none == [] and len(followers) == 1  # tp 2: one follower, started by the large model's subserver
    assert left == []  # a clean stop leaves no subserver and no rank
    for rid in PROMPTS:
        for out in (ref[rid], got[rid]):
            assert isinstance(out.end, P.Finished) and out.end.reason == "length" and out.dup == 0, (rid, out.end)
        assert got[rid].tokens == ref[rid].tokens, rid  # position -> (token, writer)
        assert got[rid].end.num_hops == ref[rid].end.num_hops > 1
        assert sum(m for _, m in got[rid].tokens.values()) >= 3  # the large model (tp 2) wrote tokens


def _start_tp2(tmp: Path) -> tuple[Server, RuntimeClient, list[int]]:
    cfg = tiny_config("eager")
    cfg = replace(cfg, models=[cfg.models[0], replace(cfg.models[1], tp=2)])
    srv = Server(cfg, run_dir=tmp).start()
    client = RuntimeClient(srv.addresses)
    client.submit("warm", [3, 4, 5], GREEDY)
    assert collect(client, {"warm"})["warm"].end.reason == "length"
    followers = _followers(srv)
    assert len(followers) == 1
    return srv, client, followers


def test_a_dead_rank_fails_the_server_and_leaves_no_process(tmp_path):
    srv, client, followers = _start_tp2(tmp_path)
    fatal: list[str] = []
    srv.add_fatal_listener(fatal.append)
    pids = [p.pid for p in srv.processes] + followers
    try:
        client.submit("long", [7, 8, 9], P.Sampling(temperature=0.0, max_tokens=600, ignore_eos=True))
        client.until(lambda ev: isinstance(ev, P.Tokens) and ev.rid == "long", 30)
        os.kill(followers[0], signal.SIGKILL)
        failed = client.until(lambda ev: isinstance(ev, P.Failed) and ev.model == 1, 30)[-1]
        assert "tensor-parallel rank 1" in failed.message and "SIGKILL" in failed.message
        deadline = time.monotonic() + 30
        while not fatal and time.monotonic() < deadline:  # the launcher sees rank 0 exit and gives up
            time.sleep(0.1)
        assert fatal and "subserver 1 (tiny-large) died" in fatal[0] and not srv.healthy()
        assert srv.processes[1].exitcode == 1
    finally:
        client.close()
        srv.stop()
    assert [p for p in pids if alive(p)] == []


def test_rank0_killed_takes_its_follower(tmp_path):
    srv, client, followers = _start_tp2(tmp_path)
    pids = [p.pid for p in srv.processes] + followers
    try:
        os.kill(srv.processes[1].pid, signal.SIGKILL)
        client.until(lambda ev: isinstance(ev, P.Failed) and ev.model == 1, 30)
        deadline = time.monotonic() + 15
        while alive(followers[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(followers[0])  # no orphan rank, before the server itself stops
    finally:
        client.close()
        srv.stop()
    assert [p for p in pids if alive(p)] == []
