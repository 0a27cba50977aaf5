"""Shared by the tcp and Ray tests: one deployment served over a transport, and the ipc reference to compare.

The reference for "the same tokens" is the same deployment served over ipc (the default transport) in this run:
greedy decoding with the seeded random R2R classifier is deterministic, so any difference in what a transport
delivers (a lost, duplicated or misrouted hand-off) changes a request's tokens or its writers.
"""

from __future__ import annotations

from dataclasses import replace

from rt_helpers import GREEDY, collect, tiny_config

from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server

PROMPTS = {f"p{k}": [20 + k, 300, 301 + k, 5] for k in range(5)}


def serve_prompts(srv: Server) -> dict[str, dict[int, tuple[int, int]]]:
    """Start `srv`, run PROMPTS concurrently, stop it; {rid: {pos: (token, model)}}."""
    srv.start()
    client = RuntimeClient(srv.addresses)
    try:
        for rid, p in PROMPTS.items():
            client.submit(rid, p, GREEDY)
        out = collect(client, set(PROMPTS), timeout_s=90)
    finally:
        client.close()
        srv.stop()
    for rid, o in out.items():
        assert o.dup == 0 and sorted(o.tokens) == list(range(GREEDY.max_tokens)), rid
    return {rid: o.tokens for rid, o in out.items()}


def on_tcp(cfg, **placement):
    return replace(cfg, placement=replace(cfg.placement, transport="tcp", **placement))


def with_external(cfg, model: int = 1, host: str | None = "127.0.0.1"):
    models = list(cfg.models)
    models[model] = replace(models[model], external=True, host=host)
    return replace(cfg, models=models)


def ipc_reference(run_dir) -> tuple:
    """The learned-router deployment served over ipc: (its config, its tokens)."""
    cfg = tiny_config(weights="random")
    tokens = serve_prompts(Server(cfg, run_dir=run_dir))
    writers = [m for t in tokens.values() for _, m in t.values()]
    assert 0 < writers.count(1) < len(writers)  # both models wrote: hand-offs crossed the transport
    return cfg, tokens
