"""Engine plumbing: KV sizing and the shared pool, host-side packing and bucket padding, batch errors,
two engines in one process, and (CUDA only) graph capture/replay against the eager path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_testlib import Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request
from tokenrouter.engine.base import ModelRunner
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import prepare_step
from tokenrouter.engine.kv_cache import kv_bytes_per_page
from tokenrouter.engine.runner import Engine

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3r")
    return make_hf_checkpoint(path, seed=6), path


def _req(rid, n, pool, extra=0, start_tok=1):
    req = Request(rid, list(range(start_tok, start_tok + n)), n)
    assert pool.grow(req.pages, n + extra)
    return req


def test_kv_pool_from_byte_budget_and_shared_pool(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, num_pages=None, kv_cache_bytes=1 << 20)
    per_page = kv_bytes_per_page(eng.spec, 4, torch.float32)
    assert per_page == 2 * 2 * 4 * 2 * 16 * 4
    assert eng.num_pages == (1 << 20) // per_page and eng.page_size == 4
    assert eng.kv_cache.nbytes <= 1 << 20
    assert isinstance(eng, ModelRunner) and eng.max_batch_size == 256
    assert eng.max_context_len == 128  # the model's max_position_embeddings, below the pool capacity
    pool = KVPool(10, 8)
    eng2 = Engine(EngineConfig(str(path), device="cpu", dtype="float32", attention_backend="torch"), kv_pool=pool)
    assert eng2.kv_pool is pool and eng2.num_pages == 10 and eng2.page_size == 8
    assert eng2.max_context_len == 72  # (10 - 1 null page) * 8
    with pytest.raises(ValueError, match="exactly one of"):
        tiny_engine(path, num_pages=None)


def test_prepare_step_pads_graph_buckets_into_the_null_page():
    pool = KVPool(32, 4)
    a, b = _req("a", 6, pool), _req("b", 3, pool, extra=2)
    b.token_ids += [50, 51]
    batch = Batch(0, 0, [BatchRow(a, 5, 1), BatchRow(b, 3, 2)])  # a decode row and a 2-token extend row
    host = prepare_step(batch, 4, 64, bucket=8, width=16)
    f = {k: host.packed[o : o + n] for k, (o, n) in host.layout.offsets().items()}
    assert host.layout.extend is False and host.layout.num_tokens == 8
    assert f["input_ids"].tolist() == [6, 50, 51, 0, 0, 0, 0, 0]
    assert f["positions"].tolist() == [5, 3, 4, 0, 0, 0, 0, 0]
    slot = lambda req, p: req.pages[p // 4] * 4 + p % 4  # noqa: E731
    assert f["slot_mapping"].tolist() == [slot(a, 5), slot(b, 3), slot(b, 4)] + [0] * 5
    # One virtual decode row per token: seq_len = position + 1 over the request's pages.
    assert f["seq_lens"].tolist() == [6, 4, 5, 1, 1, 1, 1, 1]
    bt = f["block_tables"].reshape(8, 16)
    assert bt[0, :2].tolist() == a.pages[:2] and bt[1, :2].tolist() == b.pages[:2] and (bt[1] == bt[2]).all()
    assert not bt[3:].any() and not bt[0, 2:].any()
    assert f["logits_indices"].tolist() == [0, 2, 0, 0, 0, 0, 0, 0]
    assert host.sample_positions == [6, 5]

    eager = prepare_step(batch, 4, 64)
    e = {k: eager.packed[o : o + n] for k, (o, n) in eager.layout.offsets().items()}
    assert eager.layout.extend and e["cu_seqlens_q"].tolist() == [0, 1, 3] and e["seq_lens"].tolist() == [6, 5]
    assert eager.layout.width == 2 and eager.max_q_len == 2


def test_prepare_step_from_prev_and_errors():
    pool = KVPool(16, 4)
    a = _req("a", 3, pool, extra=1)
    host = prepare_step(Batch(0, 1, [BatchRow(a, 3, 1, from_prev=True)]), 4, 64, prev_rows={id(a): 5})
    assert host.prev_dst == [0] and host.prev_src == [5] and host.packed[0] == 0
    with pytest.raises(BatchError, match="from_prev"):
        prepare_step(Batch(0, 1, [BatchRow(a, 3, 1, from_prev=True)]), 4, 64)
    with pytest.raises(BatchError, match="cannot hold"):
        prepare_step(Batch(0, 1, [BatchRow(a, 3, 3)]), 4, 64)
    with pytest.raises(BatchError, match="feeds 2 tokens but only 1 are known"):
        prepare_step(Batch(0, 1, [BatchRow(a, 2, 2)]), 4, 64)
    with pytest.raises(BatchError, match="max_context_len"):
        prepare_step(Batch(0, 1, [BatchRow(a, 0, 3)]), 4, 2)
    with pytest.raises(BatchError, match="empty"):
        prepare_step(Batch(0, 1, []), 4, 64)
    with pytest.raises(BatchError, match="bucket"):
        prepare_step(Batch(0, 1, [BatchRow(a, 0, 3)]), 4, 64, bucket=2, width=16)
    out = np.full(4096, -7, np.int32)
    host = prepare_step(Batch(0, 1, [BatchRow(a, 0, 3)]), 4, 64, out=out)
    assert np.shares_memory(host.packed, out)


def test_graph_bucket_selection(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, graph_emulation=True, graph_buckets=(4, 1, 16), graph_max_row_tokens=3)
    assert eng.graphs.buckets == (1, 4, 16)
    pool = eng.kv_pool
    reqs = [_req(f"r{i}", 4, pool) for i in range(6)]
    rows = lambda ns: Batch(0, 0, [BatchRow(r, 0, n) for r, n in zip(reqs, ns, strict=False)])  # noqa: E731
    assert eng._graph_bucket(rows([1])) == 1
    assert eng._graph_bucket(rows([1, 1])) == 4
    assert eng._graph_bucket(rows([3, 3, 3, 3, 3])) == 16
    assert eng._graph_bucket(rows([3, 3, 3, 3, 3, 3])) is None  # 18 tokens: beyond the largest bucket
    assert eng._graph_bucket(rows([4])) is None  # a row longer than graph_max_row_tokens
    assert tiny_engine(path)._graph_bucket(rows([1])) is None  # no graphs on CPU without emulation


def test_batch_limits(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, max_batch_size=2)
    reqs = [_req(f"r{i}", 2, eng.kv_pool) for i in range(3)]
    with pytest.raises(BatchError, match="max_batch_size"):
        eng.step(Batch(0, 0, [BatchRow(r, 0, 2) for r in reqs]))


def test_two_engines_in_one_process(tmp_path):
    """Different models (Qwen3 tied vs Llama with other shapes), interleaved steps, each matches its HF."""
    hf_a = make_hf_checkpoint(tmp_path / "a", seed=7, tie_word_embeddings=True)
    hf_b = make_hf_checkpoint(
        tmp_path / "b", "llama", seed=8, vocab_size=300, hidden_size=48, num_attention_heads=6,
        num_key_value_heads=3, head_dim=8, intermediate_size=80, num_hidden_layers=3,
    )  # fmt: skip
    a = Scenario(tiny_engine(tmp_path / "a", graph_emulation=True, seed=1), seed=1)
    b = Scenario(tiny_engine(tmp_path / "b", page_size=8, num_pages=40, seed=2), seed=2)
    for _ in zip(a.run(), b.run(), strict=True):
        pass
    check_against_hf(a, hf_a)
    check_against_hf(b, hf_b)
    assert a.engine.kv_pool is not b.engine.kv_pool


@cuda_only
def test_cuda_graphs_match_eager(ckpt):
    hf, path = ckpt
    kw = {"device": "cuda", "dtype": "float32", "attention_backend": "auto"}
    eager = Scenario(tiny_engine(path, cuda_graphs=False, **kw))
    eager.finish()
    graphed_engine = tiny_engine(path, cuda_graphs=True, **kw)
    assert graphed_engine.graphs_enabled, graphed_engine.graph_error
    graphed = Scenario(graphed_engine)
    graphed.finish()
    for x, y in zip(eager.records, graphed.records, strict=True):
        assert x.token == y.token
        assert float((x.logits - y.logits).abs().max()) < 1e-3 * float(x.logits.abs().max())
    check_against_hf(graphed, hf, tol=2e-3)  # cuBLAS may use TF32-free but reordered fp32 sums
