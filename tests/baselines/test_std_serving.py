"""The standard-serving baseline and the single-model baselines on the tiny CPU pair (real processes, sockets).

References are independent of the servers under test: each token is the greedy token of the model that writes it
given the whole sequence, computed here from scratch with an `Engine` per model (same dummy weights, seed 0) and
fresh pages for every token; the writer of each position comes from the hop trace (`trace` router: a function of
the request and the position, so the routed runtime and the baseline must agree whatever their timing)."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import GREEDY, collect, tiny_config

from tokenrouter.baselines.launcher import BaselineServer
from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.config import RouterConfig
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.client import RuntimeClient
from tokenrouter.runtime.launcher import Server

pytestmark = pytest.mark.runtime
PS = 16  # the tiny config's page size
SHARED = [(7 * k) % 900 + 3 for k in range(32)]  # a two-page "system prompt" every request starts with
PROMPTS = {f"t{k}": [*SHARED, 40 + k, 300, 301 + k, 5, 11, 12, 13, 14] for k in range(6)}


class Greedy:
    """The reference: model `name`'s greedy next token for a whole sequence, computed from scratch."""

    def __init__(self) -> None:
        from tokenrouter.engine import Engine, EngineConfig

        self.engines = {n: Engine(EngineConfig(model=n, load_format="dummy", device="cpu", seed=0, page_size=PS,
                                               num_pages=16, cuda_graphs=False, warmup=False), kv_pool=KVPool(16, PS))
                        for n in ("tiny-small", "tiny-large")}  # fmt: skip
        self.step = 0

    def next(self, name: str, seq: list[int]) -> int:
        eng = self.engines[name]
        req = Request(f"ref{self.step}", list(seq), len(seq))
        assert eng.kv_pool.grow(req.pages, len(seq))
        tok = int(eng.step(Batch(0, self.step, [BatchRow(req, 0, len(seq))])).result().next_token_ids[0])
        self.step += 1
        eng.kv_pool.release(req.pages)
        return tok

    def run(self, prompt: list[int], writers: list[str]) -> list[int]:
        seq = list(prompt)
        for name in writers:
            seq.append(self.next(name, seq))
        return seq[len(prompt) :]


@pytest.fixture(scope="module")
def greedy():
    g = Greedy()
    yield g
    for e in g.engines.values():
        e.close()


def _trace(path: Path, n_tokens: int) -> dict[str, list[int]]:
    """A hop trace where every request visits the large model at least twice; returns the writer of each
    position per request."""
    rng = random.Random(3)
    writers = {}
    with path.open("w") as f:
        for rid in PROMPTS:
            w = [0] * n_tokens
            for pos in rng.sample(range(1, n_tokens - 1), 3):
                w[pos] = 1
            w[2] = w[3] = 1  # one run of two tokens on the large model
            runs: list[list[int]] = []
            for m in w:
                if runs and runs[-1][0] == m:
                    runs[-1][1] += 1
                else:
                    runs.append([m, 1])
            f.write(json.dumps({"id": rid, "prompt_len": len(PROMPTS[rid]), "runs": runs}) + "\n")
            writers[rid] = w
    return writers


def _serve(srv: Server, prompts: dict[str, list[int]], sequential: bool = False, stats: list | None = None):
    client = RuntimeClient(srv.addresses)
    out = {}
    try:
        if sequential:
            for rid, p in prompts.items():
                client.submit(rid, p, GREEDY)
                out.update(collect(client, {rid}, timeout_s=60, stats=stats))
        else:
            for rid, p in prompts.items():
                client.submit(rid, p, GREEDY)
            out = collect(client, set(prompts), timeout_s=90, stats=stats)
        if stats is not None:  # the Stats sent after the last step (within 50 ms of a change)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                ev = client.recv(0.2)
                if isinstance(ev, P.Stats):
                    stats.append(ev)
    finally:
        client.close()
        srv.stop()
    for rid, o in out.items():
        assert isinstance(o.end, P.Finished) and o.end.reason == "length" and o.dup == 0, (rid, o.end)
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory, greedy):
    """The same trace-routed deployment served routed and as std-serving, plus the reference."""
    tmp = tmp_path_factory.mktemp("trace")
    writers = _trace(tmp / "trace.jsonl", GREEDY.max_tokens)
    cfg = tiny_config("eager")
    cfg = replace(cfg, router=RouterConfig("trace", trace=str(tmp / "trace.jsonl")))
    routed = _serve(Server(cfg, run_dir=tmp / "routed").start(), PROMPTS)
    stats: list[P.Stats] = []
    std_srv = BaselineServer(cfg, "std-serving", run_dir=tmp / "std", step_logs=True).start()
    std = _serve(std_srv, PROMPTS, stats=stats)
    names = ("tiny-small", "tiny-large")
    ref = {rid: greedy.run(p, [names[m] for m in writers[rid]]) for rid, p in PROMPTS.items()}
    visits = [json.loads(x) for x in std_srv.visit_log().read_text().splitlines()]
    return writers, ref, routed, std, stats, visits


def test_std_serving_writes_the_routed_runtimes_tokens(traced):
    writers, ref, routed, std, _, _ = traced
    for rid in PROMPTS:
        assert routed[rid].ids() == ref[rid], rid
        assert std[rid].ids() == ref[rid], rid
        for out in (routed[rid], std[rid]):
            assert [m for _, m in (out.tokens[k] for k in sorted(out.tokens))] == writers[rid]
        visits_large = sum(1 for i, m in enumerate(writers[rid]) if m == 1 and (i == 0 or writers[rid][i - 1] == 0))
        assert routed[rid].end.num_hops == std[rid].end.num_hops == visits_large


def test_std_serving_rematches_prefixes_and_returns_every_page(traced):
    _, _, _, _, stats, visits = traced
    last = {s.model: s for s in stats}
    for m in (0, 1):
        mine = [v for v in visits if v["model"] == m]
        s = last[m]
        assert s.prefix_requests == len(mine) and s.prefix_prompt_tokens == sum(v["prefix"] for v in mine)
        # Upper bound: whole pages, at least one token left to compute. Lower bound: a visit back to a model finds
        # at least what that model computed for the request on its previous visit (the dispatcher sends it only
        # after that visit ended, whose steps cached their pages; the pool is large enough never to evict).
        hi = sum((v["prefix"] - 1) // PS * PS for v in mine)
        lo = 0
        for v in mine:
            before = [u for u in mine if u["rid"] == v["rid"] and u["visit"] < v["visit"]]
            if before:
                u = max(before, key=lambda u: u["visit"])
                computed = u["prefix"] + u["tokens"] - 1  # its last sampled token was never fed
                lo += min(computed, v["prefix"] - 1) // PS * PS
        assert lo > 0 and lo <= s.prefix_matched_tokens <= hi, (m, lo, s.prefix_matched_tokens, hi)
        assert s.prefix_hits > 0 and s.prefix_evicted_pages == 0
        # Every request ended: the only pages still in use are the cache's.
        assert s.kv_pages_used == s.prefix_cached_pages > 0 and s.running == 0 and s.waiting == 0


def test_std_serving_draws_the_synthetic_routers_decisions_as_the_routed_runtime(tmp_path):
    """One request at a time, overlap off: the routed schedulers draw one decision per sampled token from each
    model's (seed, model) stream, and so does the dispatcher; so the outputs and their writers agree."""
    cfg = tiny_config("eager", hop_rate=0.3, overlap=False)
    prompts = {f"s{k}": [20 + k, 300, 301 + k, 5] for k in range(3)}
    routed = _serve(Server(cfg, run_dir=tmp_path / "routed").start(), prompts, sequential=True)
    std = _serve(BaselineServer(cfg, "std-serving", run_dir=tmp_path / "std").start(), prompts, sequential=True)
    hops = 0
    for rid in prompts:
        assert std[rid].tokens == routed[rid].tokens, rid
        assert std[rid].end.num_hops == routed[rid].end.num_hops
        hops += routed[rid].end.num_hops
    assert hops > 0


@pytest.mark.parametrize(("mode", "name"), [("llm-only", "tiny-large"), ("slm-only", "tiny-small")])
def test_single_model_baselines_give_that_models_greedy_output(tmp_path, greedy, mode, name):
    prompts = {k: PROMPTS[k] for k in ("t0", "t1", "t2")}
    srv = BaselineServer(tiny_config("eager"), mode, run_dir=tmp_path)
    assert srv.model_names == [name]
    out = _serve(srv.start(), prompts)
    for rid, p in prompts.items():
        assert out[rid].ids() == greedy.run(p, [name] * GREEDY.max_tokens), rid
        assert {m for _, m in out[rid].tokens.values()} == {0} and out[rid].end.num_hops == 0


def test_a_learned_router_is_refused_before_anything_starts(tmp_path):
    cfg = tiny_config("eager", weights="random")
    with pytest.raises(ValueError, match="learned router"):
        BaselineServer(cfg, "std-serving", run_dir=tmp_path)
