"""One row the engine refuses fails only its own request; the subserver serves on.

In process (`LocalLoop`, the subserver's loop on the tiny CPU model): a prompt that carries a token id outside the
vocabulary, and a peer return that carries one (the H200 incident's 32B met a row carrying token id V), each beside
requests in the same batch, with overlap and without. The bad request ends with "error", its KV pages go back, the
peer is told it ended, a WARNING names it and the reason, and every other request writes exactly the tokens of a run
without the bad one. A batch refused as a whole fails its requests together and the loop goes on. In real processes:
a request whose row the engine refuses (log-probabilities beyond the limit, sent past the HTTP front-end's check)
ends with "error" while the others finish and the subserver stays up (before, the BatchError ended the process and
the server)."""

from __future__ import annotations

import logging

import pytest
from rt_helpers import collect, serves_on_and_drains, stop_and_check_gone, tiny_config

from tokenrouter.core.messages import PeerReq
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.runner import Engine
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server
from tokenrouter.runtime.local_loop import EchoPeer, LocalLoop, PositionHopRouter

VOCAB = 1024  # tiny-small's
PROMPTS = {"a": [5, 6, 7, 8, 9], "b": [11, 12, 13], "c": [20, 21, 22, 23, 24, 25, 26], "bad": [30, 31, 32, 33]}
SAMPLING = SamplingParams(max_tokens=12, ignore_eos=True)


class BadReturnPeer(EchoPeer):
    """An `EchoPeer` whose first return of request "bad" carries token id VOCAB (outside the vocabulary), as a peer
    whose sampler picked a masked lane would send; it records the finish messages it is told."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab, delay=1)
        self.told: dict[str, str | None] = {}
        self.poisoned = False

    def send(self, msg: PeerReq) -> None:
        if msg.finished:
            self.told[msg.rid] = msg.finish_reason
        super().send(msg)
        if msg.rid == "bad" and not msg.finished and not self.poisoned:
            self.poisoned = True
            back = self.queue[-1][1]
            back.tokens[0] = VOCAB


def _serve(prompts: dict[str, list[int]], *, overlap: bool, peer: EchoPeer | None = None):
    eng = Engine(EngineConfig(model="tiny-small", load_format="dummy", device="cpu", page_size=4, num_pages=96,
                              max_batch_size=8, cuda_graphs=False, graph_emulation=True))  # fmt: skip
    pool_free = eng.kv_pool.num_free
    sched = Scheduler(0, 2, kv=eng.kv_pool, router=PositionHopRouter(period=3), max_batch_size=8,
                      max_batch_tokens=64, overlap=overlap)  # fmt: skip
    reqs = {rid: Request(rid, list(ids), len(ids), sampling=SAMPLING) for rid, ids in prompts.items()}
    for r in reqs.values():
        sched.add(r)
    loop = LocalLoop(eng, sched, peer=peer or EchoPeer(VOCAB, delay=1), keep_handles=True)
    loop.run(max_steps=500)
    assert eng.kv_pool.num_free == pool_free  # every page back, the failed request's included
    return {rid: r.token_ids[r.prompt_len :] for rid, r in reqs.items()}, loop


def _refused_beside_others(loop: LocalLoop, rid: str) -> None:
    """The step whose row of `rid` was refused ran its other rows (one batch, the bad row skipped)."""
    for h in loop.handles:
        rows = h.batch.rows
        bad = [i for i, row in enumerate(rows) if row.req.rid == rid]
        if bad and bad[0] in h.skipped_rows:
            assert any(i not in h.skipped_rows for i in range(len(rows)))
            return
    raise AssertionError(f"no step refused the row of {rid}")


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_prompt_tokens_outside_the_vocabulary_fail_only_their_requests(overlap, caplog):
    ref, _ = _serve({k: v for k, v in PROMPTS.items() if k != "bad"}, overlap=overlap)
    bad = {"bad": [30, VOCAB, 32, 33], "bad2": [VOCAB + 7, 1]}  # two refused rows: the step is planned three times
    with caplog.at_level(logging.WARNING, logger="tokenrouter.runtime.engine_loop"):
        outs, loop = _serve({**PROMPTS, **bad}, overlap=overlap)
    assert loop.finished == {"a": "length", "b": "length", "c": "length", "bad": "error", "bad2": "error"}
    assert outs["bad"] == outs["bad2"] == []
    assert {k: outs[k] for k in ref} == ref
    _refused_beside_others(loop, "bad")
    _refused_beside_others(loop, "bad2")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("request bad fails" in m and f"token id {VOCAB} outside the vocabulary" in m for m in lines), lines
    assert any("request bad2 fails" in m and f"token id {VOCAB + 7} outside" in m for m in lines), lines


def test_a_batch_refused_as_a_whole_fails_its_requests_and_the_loop_goes_on():
    """More rows than the engine takes (a scheduler configured past the engine): no row is at fault, so the batch's
    requests fail together, as for a failed launch; the loop does not raise."""
    eng = Engine(EngineConfig(model="tiny-small", load_format="dummy", device="cpu", page_size=4, num_pages=96,
                              max_batch_size=2, cuda_graphs=False))  # fmt: skip
    pool_free = eng.kv_pool.num_free
    sched = Scheduler(0, 2, kv=eng.kv_pool, router=PositionHopRouter(period=3), max_batch_size=8,
                      max_batch_tokens=64, overlap=False)  # fmt: skip
    for rid, ids in PROMPTS.items():
        sched.add(Request(rid, list(ids), len(ids), sampling=SAMPLING))
    loop = LocalLoop(eng, sched, peer=EchoPeer(VOCAB, delay=1))
    loop.run(max_steps=50)
    assert loop.finished == dict.fromkeys(PROMPTS, "error")
    assert eng.kv_pool.num_free == pool_free


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_peer_return_outside_the_vocabulary_fails_only_its_request(overlap):
    ref, _ = _serve(PROMPTS, overlap=overlap)
    peer = BadReturnPeer(VOCAB)
    outs, loop = _serve(PROMPTS, overlap=overlap, peer=peer)
    assert peer.poisoned  # "bad" hopped and came back with the bad token
    assert loop.finished == {"a": "length", "b": "length", "c": "length", "bad": "error"}
    assert peer.told.get("bad") == "abort"  # the peer drops it, as for any aborted request
    assert {k: outs[k] for k in ("a", "b", "c")} == {k: ref[k] for k in ("a", "b", "c")}
    _refused_beside_others(loop, "bad")


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_refused_row_in_a_subserver_fails_its_request_and_serving_goes_on(tmp_path, overlap):
    srv = Server(tiny_config(hop_rate=0.0, overlap=overlap), run_dir=tmp_path, stats_interval_s=0.05)
    srv.start()
    client = RuntimeClient(srv.addresses)
    try:
        n_out = 16
        good = P.Sampling(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        # the HTTP front-end caps top_logprobs at 20; the engine refuses the row of a request that asks for more
        refused = P.Sampling(temperature=0.0, max_tokens=n_out, ignore_eos=True, logprobs=21)
        rids = ["g0", "g1", "bad", "g2"]
        for k, rid in enumerate(rids):
            client.submit(rid, [3 + k, 40, 41, 7], refused if rid == "bad" else good)
        out = collect(client, set(rids))  # a subserver that dies sends Failed: collect raises
        assert out["bad"].end.reason == "error" and out["bad"].end.num_output == 0
        for rid in ("g0", "g1", "g2"):
            assert out[rid].end.reason == "length" and sorted(out[rid].tokens) == list(range(n_out)), rid
        serves_on_and_drains(client, srv)
    finally:
        stop_and_check_gone(client, srv)
