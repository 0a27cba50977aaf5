"""Tensor parallelism on CPU: rank 0 is this test process, rank 1 a follower process (`runtime.tp_ranks`), the group
is gloo. A TP=2 engine must compute what a TP=1 engine of the same seed computes (float32, up to summation order)
over prefill, decode, mixed and peer-return steps on paged KV, with eager passes and with the padded graph paths;
greedy serving through the core scheduler with overlap (from_prev rows the follower resolves on its own device),
preemption and hops must write the same tokens; a sharded HF checkpoint must match HF itself. Each test starts one
follower (about a second)."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import PLAN, Scenario, check_against_hf, make_hf_checkpoint

pytest.importorskip("zmq")

from tokenrouter.core.config import ConfigError, DeploymentConfig, ModelConfig
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.deploy.placement import check_gpus
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.errors import EngineError, ModelLoadError
from tokenrouter.engine.parallel import check_divides
from tokenrouter.engine.runner import Engine
from tokenrouter.models import load_spec
from tokenrouter.runtime.local_loop import EchoPeer, LocalLoop, PositionHopRouter
from tokenrouter.runtime.tp_ranks import TPRanks

BASE = {"model": "tiny-large", "device": "cpu", "dtype": "float32", "page_size": 4, "num_pages": 64,
        "attention_backend": "torch", "cuda_graphs": False, "graph_buckets": (1, 2, 4, 8, 16, 32)}  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    """Rank 0 on one thread, as its follower is: two processes of two threads each on CI's two cores spend more
    time contending than computing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pair(**overrides) -> tuple[Engine, Engine, TPRanks]:
    """(TP=1 engine, rank 0 of a TP=2 engine, its ranks) of one config: two engines in this process."""
    kw = {**BASE, **overrides}
    ref = Engine(EngineConfig(**kw))
    ranks = TPRanks(2, kw, timeout_s=120)
    return ref, Engine(EngineConfig(**kw), tp=ranks.tp, followers=ranks), ranks


def close(*engines: Engine) -> None:
    for e in engines:
        e.close()


@pytest.mark.parametrize("emulate", [False, True], ids=["eager", "graph-paths"])
def test_tp2_logits_equal_tp1_over_prefill_decode_and_mixed_steps(emulate):
    ref, eng, ranks = pair(graph_emulation=emulate)
    try:
        a, b = Scenario(ref, seed=3), Scenario(eng, seed=3)
        for _ in zip(a.run(), b.run(), strict=True):  # interleaved: the two engines' steps alternate
            pass
        assert len(a.records) == len(b.records) > 10
        kinds = {(n is None, len(s)) for s in PLAN for _, n, _, _ in s}
        assert (True, 2) in kinds and (False, 4) in kinds  # prefill-only and mixed steps are in the plan
        for x, y in zip(a.records, b.records, strict=True):
            assert (x.rid, x.pos) == (y.rid, y.pos)
            torch.testing.assert_close(y.logits, x.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(y.hidden, x.hidden, rtol=1e-5, atol=1e-5)
            assert x.token == y.token
        spread = torch.stack([x.logits for x in a.records]).std()
        assert spread > 0.1  # logits that differ by far more than the tolerance between rows
        # Each rank holds half the KV heads, on the same pages.
        assert eng.kv_cache.kv.shape[-2] * 2 == ref.kv_cache.kv.shape[-2] == eng.spec.num_kv_heads
    finally:
        close(eng, ref)
    assert ranks.procs[0].exitcode == 0  # the follower stopped with rank 0's engine


def test_tp2_sharded_checkpoint_with_biases_matches_hf(tmp_path):
    """Llama with attention bias: q/k/v biases split with their heads, o_proj's (row-parallel) added once. A
    multi-file checkpoint, read through safetensors slices."""
    hf = make_hf_checkpoint(tmp_path, "llama", seed=7, shard=True, attention_bias=True)
    kw = {**BASE, "model": str(tmp_path)}
    ranks = TPRanks(2, kw, timeout_s=120)
    eng = Engine(EngineConfig(**kw), tp=ranks.tp, followers=ranks)
    try:
        assert eng.model.layers[0].self_attn.o_proj.bias is not None
        scn = Scenario(eng, seed=1)
        scn.finish()
        assert check_against_hf(scn, hf) > 10
    finally:
        eng.close()


def _serve(engine: Engine, n: int = 4, max_tokens: int = 64) -> dict[str, list[int]]:
    """Greedy generations through the core scheduler with overlap and a pool small enough to preempt; a
    deterministic router sends rows to a peer that returns 2-4 tokens (extend rows)."""
    sched = Scheduler(0, 2, kv=engine.kv_pool, router=PositionHopRouter(period=6), max_batch_size=8,
                      max_batch_tokens=16, overlap=True)  # fmt: skip
    g = torch.Generator().manual_seed(11)
    reqs = []
    for i in range(n):
        plen = [5, 13, 3, 21][i % 4]
        ids = torch.randint(0, engine.spec.vocab_size, (plen,), generator=g).tolist()
        reqs.append(Request(f"r{i}", ids, plen, sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
        sched.add(reqs[-1])
    loop = LocalLoop(engine, sched, peer=EchoPeer(engine.spec.vocab_size, delay=2), keep_handles=True)
    loop.run(max_steps=3000)
    assert set(loop.finished) == {r.rid for r in reqs}
    assert any(r.from_prev for h in loop.handles for r in h.batch.rows)
    return {r.rid: r.token_ids[r.prompt_len :] for r in reqs}


def test_tp2_greedy_tokens_equal_tp1_for_64_tokens_with_overlap():
    ref, eng, _ = pair(num_pages=40, graph_emulation=True)
    try:
        want, got = _serve(ref), _serve(eng)
    finally:
        close(eng, ref)
    assert all(len(t) >= 64 for t in want.values())
    assert got == want


def test_tp_must_divide_the_heads():
    spec = load_spec("tiny-large")  # 4 heads, 2 KV heads
    check_divides(spec, 2)
    with pytest.raises(ModelLoadError, match="tp=3 does not divide"):
        check_divides(spec, 3)
    with pytest.raises(ModelLoadError, match="tp=4 does not divide its 2 KV heads"):
        check_divides(spec, 4)
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large", tp=4, gpus=[0, 1, 2, 3])])
    with pytest.raises(ConfigError, match="model tiny-large: tp=4 does not divide its 2 KV heads"):
        check_gpus(cfg, "cpu")


def test_cuda_needs_one_gpu_per_rank_and_cpu_ignores_gpus():
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large", tp=2, gpus=[0])])
    check_gpus(cfg, "cpu")
    with pytest.raises(ConfigError, match="tp=2 needs 2 GPU\\(s\\), but its gpus are \\[0\\]"):
        check_gpus(cfg, "cuda")
    check_gpus(DeploymentConfig(models=[ModelConfig("tiny-large", tp=2, gpus=[2, 3])]), "cuda")


def test_rank0_needs_followers_and_followers_take_no_batches():
    from tokenrouter.engine.parallel import TensorParallel

    with pytest.raises(ValueError, match="needs a StepSink"):
        Engine(EngineConfig(**BASE), tp=TensorParallel(0, 2))
    with pytest.raises(EngineError, match="takes no batches"):
        Engine.step(_FakeFollower(), None)  # type: ignore[arg-type]


class _FakeFollower:
    closed = False
    tp = type("TP", (), {"leader": False, "rank": 1})()
