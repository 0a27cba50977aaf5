"""The runtime when the engine fails (`EngineConfig.fail_step_ids` / `fail_captures`, the engine's fault
injection, reaching real subserver processes through `Server(engine_overrides=...)`): a failed step ends the
requests of its batch with "error" and serving goes on, with overlap (step k still in flight when step k+1
fails) and without; a failed graph capture is a start-up error that leaves nothing running."""

from __future__ import annotations

import pytest
from rt_helpers import alive, collect, serves_on_and_drains, stop_and_check_gone, tiny_config

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server, StartupError

VOCAB = 1024  # the tiny models'
FAILED_STEP = 3  # the entry's step 3: under overlap it is launched while step 2 is still in flight


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_failed_step_ends_its_requests_with_error_and_serving_goes_on(tmp_path, overlap):
    cfg = tiny_config(hop_rate=0.0, overlap=overlap)  # only the entry model runs steps
    srv = Server(cfg, run_dir=tmp_path, stats_interval_s=0.05, engine_overrides={"fail_step_ids": (FAILED_STEP,)})
    srv.start()
    client = RuntimeClient(srv.addresses)
    try:
        n_out = 24
        long = P.Sampling(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        rids = [f"f{k}" for k in range(4)]
        for k, rid in enumerate(rids):
            client.submit(rid, [3 + k, 40, 41, 7], long)
        out = collect(client, set(rids))  # a subserver that dies sends Failed: collect raises
        failed = {rid for rid, o in out.items() if o.end.reason == "error"}
        assert failed  # the failed step carried requests, and they end with "error"
        for rid, o in out.items():
            assert isinstance(o.end, P.Finished) and o.dup == 0
            assert all(0 <= t < VOCAB for t in o.ids())  # no placeholder token of the failed step leaks out
            assert sorted(o.tokens) == list(range(o.end.num_output))
            if rid in failed:
                assert o.end.num_output < n_out
            else:
                assert o.end.reason == "length" and o.end.num_output == n_out
        serves_on_and_drains(client, srv)
    finally:
        stop_and_check_gone(client, srv)


def test_a_failed_graph_capture_is_a_startup_error(tmp_path):
    srv = Server(tiny_config(), run_dir=tmp_path, engine_overrides={"graph_emulation": True, "fail_captures": 1})
    with pytest.raises(StartupError, match=r"failed during start-up: .*CUDA graph capture failed .*InjectedFault"):
        srv.start()
    assert not any(alive(p.pid) for p in srv.processes)
