"""The context limit over the ZeroMQ protocol (no HTTP front-end checking first): the core rejects a request
past the models' position limit at admission, and the entry subserver keeps serving. Before, such a request
was admitted by KV room alone and the engine's refusal of the batch killed the entry subserver."""

from __future__ import annotations

import pytest
from rt_helpers import alive, collect, tiny_config

from tokenrouter.models import load_spec
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    # KV pools larger than the tiny models' position limit: KV room alone would admit what the model cannot run.
    srv = Server(tiny_config(kv_tokens=8192), run_dir=tmp_path_factory.mktemp("ctx")).start()
    client = RuntimeClient(srv.addresses)
    yield srv, client
    client.close()
    pids = [p.pid for p in srv.processes]
    srv.stop()
    assert not any(alive(p) for p in pids)


def test_request_past_the_position_limit_is_rejected_and_the_entry_survives(roomy):
    srv, client = roomy
    limit = min(load_spec(n).max_position_embeddings for n in ("tiny-small", "tiny-large"))
    assert all(r.kv_capacity_tokens > limit + 8 for r in srv.ready.values())
    assert srv.max_context_len == limit
    prompt = [(7 * k) % 900 + 1 for k in range(limit + 8)]
    client.submit("over", prompt, P.Sampling(temperature=0.0, max_tokens=2, ignore_eos=True))
    client.submit("at", prompt[: limit - 4], P.Sampling(temperature=0.0, max_tokens=4, ignore_eos=True))
    out = collect(client, {"over", "at"}, timeout_s=120)
    over = out["over"].end
    assert isinstance(over, P.Rejected) and over.status == 400 and "context length" in over.message, over
    at = out["at"].end
    assert isinstance(at, P.Finished) and at.reason == "length" and at.num_output == 4, at
    assert srv.healthy() and all(p.exitcode is None for p in srv.processes)
