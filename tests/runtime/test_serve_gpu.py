"""`tokenrouter serve` on a CUDA device, as a user runs it there: the tiny pair under MPS with CUDA graphs, a
delayed policy, streamed completions from both models, a policy change through the admin endpoint (the policy on
the wire to every subserver), then a clean stop with no process left. Skips without a CUDA device; the GPU machine
runs it with `-m gpu`, so a change to the runtime's processes, supervision or messages is checked on the device.

References: each streamed token names the model that wrote it, so writers and hops are checked against R2R's
semantics (the large model writes one token per visit), not against numbers the server reports about itself."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("zmq")

from cuda_marks import cuda_only
from served import Served, stream_completion, terminate, write_config

KEY = "gpu-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [[5, 17, 300, 42, 9, 77], [400, 401, 402, 12], [7] * 30, [1, 2, 3], [9, 9, 8], [11] * 5]


async def _many(url: str, n: int):
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(stream_completion(client, url, p, n) for p in PROMPTS))


@cuda_only()
def test_routed_serving_on_the_device_with_a_live_policy_change(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml", "r2r", hop_rate=0.4, policy="delayed")
    srv = Served.start(tmp_path, cfg, device="cuda", extra=("--admin-key", KEY), timeout_s=300)
    try:
        n = 16
        for round_ in range(2):
            outs = asyncio.run(_many(srv.url, n))
            for s in outs:
                assert s.error is None and s.done, s.error
                assert len(s.models) == n == s.usage["completion_tokens"]
                assert s.tokenrouter["hops"] == sum(1 for m in s.models if m != 0), (s.tokenrouter, s.models)
            assert {0, 1} <= {m for s in outs for m in s.models}, "at hop rate 0.4 both models write"
            if round_ == 0:
                r = httpx.post(srv.url + "/admin/policy", json={"policy": "delayed", "thresholds": [1, 2]},
                               headers=AUTH, timeout=30)  # fmt: skip
                assert r.status_code == 200, r.text
                got = httpx.get(srv.url + "/admin/policy", headers=AUTH, timeout=10).json()
                assert got["policy"] == "delayed" and got["thresholds"] == [1, 2], got
        assert terminate(srv) < 30
    finally:
        srv.kill()
