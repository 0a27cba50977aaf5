"""Varlen graphs (graph emulation on CPU: the padded static-buffer path run eagerly): row placement and bucket
choice at the edges, one pass for a step with a prefill chunk and decode rows, results equal to the plain
eager engine, and padding that never writes a real KV page."""

from __future__ import annotations

import pytest
import torch
from cuda_marks import cuda_only
from engine_testlib import decode_rows_beside_prefill, make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.varlen_shapes import VarlenShapes, default_buckets


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3varlen")
    make_hf_checkpoint(path, seed=31)
    return path


def _shapes(max_rows: int = 8) -> VarlenShapes:
    return VarlenShapes.build((16, 32, 64), max_rows=max_rows, long_rows=4, short_q=4, page_size=4)


def test_default_buckets_pad_less_than_half():
    b = default_buckets(8192)
    assert b[0] == 16 and b[-1] == 8192 and list(b) == sorted(set(b))
    assert {16, 32, 1024, 8192} <= set(b) and {24, 48, 768, 6144} <= set(b)
    for n in range(17, 8193, 7):  # the smallest bucket holding n tokens pads by less than half of n
        t = next(x for x in b if x >= n)
        assert t - n < n / 2, (n, t)
    assert default_buckets(100) == (16, 24, 32, 48, 64, 96, 100)


def test_padding_budget_sends_half_empty_buckets_eager():
    s = VarlenShapes.build((16, 32, 64), max_rows=8, long_rows=4, short_q=4, page_size=4, max_pad=10)
    assert s.fit([22])[0].tokens == 32  # 10 padding tokens: within the budget
    assert s.fit([21]) is None  # 11: an eager pass instead
    assert s.fit([33]) is None and s.fit([60])[0].tokens == 64


def test_padding_budget_scales_with_model_size():
    from tokenrouter.engine.varlen_shapes import max_pad_tokens
    from tokenrouter.models import load_spec

    small, large = load_spec("qwen3-0.6b"), load_spec("qwen3-32b")
    pad_small = max_pad_tokens(small.num_params, small.num_layers)
    pad_large = max_pad_tokens(large.num_params, large.num_layers)
    # 32B: a padded token costs ~0.1 ms, an eager pass saves ~0.25 ms of launches per layer (64 layers)
    assert 100 < pad_large < 250 < 2048 < pad_small


def test_bucket_edges_exactly_full_and_one_over():
    s = _shapes()
    assert s.fit([16])[0].tokens == 16  # exactly full
    assert s.fit([17])[0].tokens == 32  # one token over: the next bucket
    assert s.fit([64])[0].tokens == 64
    assert s.fit([65]) is None  # beyond the largest bucket: eager
    assert s.fit([1] * 12)[0].tokens == 16  # 8 short rows + 4 spilled into the long group's rows
    assert s.fit([1] * 13) is None  # rows exceed every bucket's row bound: eager
    assert s.fit([5] * 4)[0].tokens == 32  # exactly the long rows
    assert s.fit([5] * 5) is None  # one long row over
    assert s.fit([20, 1, 1])[0].tokens == 32


def test_placement_long_rows_first_short_rows_keep_batch_order():
    shape, order = _shapes().fit([1, 9, 2, 6, 1])
    assert order == [1, 3, -1, -1, 0, 2, 4]  # long group (2 rows + 2 padding rows), then the short group
    assert all(shape.short_q >= [1, 9, 2, 6, 1][i] for i in order[4:])


def _reqs(vocab: int, lens: list[int], seed: int = 3) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    params = [SamplingParams(temperature=0.7 * (i % 2), seed=i) for i in range(len(lens))]
    return [Request(f"q{i}", torch.randint(0, vocab, (n,), generator=g).tolist(), n, sampling=params[i])
            for i, n in enumerate(lens)]  # fmt: skip


def _drive(eng, lens: list[int], chunk: int):
    """Prefill every request in one step (decode rows: 1-token prompts fed one at a time), then a step with a
    `chunk`-token prefill chunk of a new request plus one decode row per earlier request."""
    pool, vocab = eng.kv_pool, eng.spec.vocab_size
    reqs = _reqs(vocab, lens)
    rows = []
    for r in reqs:
        assert pool.grow(r.pages, r.num_tokens + 2)
        rows.append(BatchRow(r, 0, r.num_tokens))
    first = eng.step(Batch(0, 0, rows), return_logits=True).result()
    for r, t in zip(reqs, first.next_token_ids.tolist(), strict=True):
        r.num_computed = r.num_tokens
        r.token_ids.append(t)
    new = _reqs(vocab, [chunk + 3], seed=9)[0]
    assert pool.grow(new.pages, chunk)
    rows = [BatchRow(new, 0, chunk, sample=False)] + [BatchRow(r, r.num_tokens - 1, 1) for r in reqs]
    h = eng.step(Batch(0, 1, rows), return_logits=True)
    return first, h, h.result(), [*reqs, new]


def test_prefill_chunk_plus_decode_rows_take_one_varlen_bucket_and_match_eager(ckpt):
    kw = {"num_pages": 48, "max_batch_size": 8, "max_num_batched_tokens": 64}
    eng = tiny_engine(ckpt, graph_emulation=True, **kw)
    ref = tiny_engine(ckpt, **kw)  # plain eager varlen pass
    assert eng.varlen_shapes is not None and eng.varlen_shapes.buckets == list(default_buckets(64))
    f1, h, res, reqs = _drive(eng, [3, 5, 2], chunk=20)
    f2, h_ref, res_ref, _ = _drive(ref, [3, 5, 2], chunk=20)
    assert h.varlen_bucket == 24 and h.graph_bucket is None and h.eager_tokens == 23  # one pass, one bucket
    assert h_ref.varlen_bucket is None
    assert f1.next_token_ids.tolist() == f2.next_token_ids.tolist()
    assert res.next_token_ids.tolist() == res_ref.next_token_ids.tolist()
    assert res.next_token_ids[0] == -1  # the chunk samples nothing
    assert float((res.logits - res_ref.logits).abs().max()) < 1e-4
    # KV equal on every page the requests hold; padding tokens wrote only the null page 0.
    for (k, v), (k_ref, v_ref) in zip(eng.kv_cache.layers, ref.kv_cache.layers, strict=True):
        for r in reqs:
            idx = torch.tensor(r.pages)
            assert torch.allclose(k[idx], k_ref[idx], atol=1e-5) and torch.allclose(v[idx], v_ref[idx], atol=1e-5)


def test_padding_never_writes_a_real_page(ckpt):
    eng = tiny_engine(ckpt, graph_emulation=True, num_pages=48, max_batch_size=8, max_num_batched_tokens=64)
    k0 = [k.clone() for k, _ in eng.kv_cache.layers]
    _, h, _, reqs = _drive(eng, [2, 1], chunk=9)  # 11 real tokens padded to 16, rows padded to 12
    assert h.varlen_bucket == 16
    held = {p for r in reqs for p in r.pages}
    for (k, _), before in zip(eng.kv_cache.layers, k0, strict=True):
        changed = {int(p) for p in torch.nonzero((k != before).flatten(1).any(1)).flatten()}
        assert changed - {0} <= held  # only the requests' pages (and the null page) were written
    table = eng.table.table
    assert int(table[0].abs().sum()) == 0  # the null slot still points at page 0 only


def test_steps_beyond_the_largest_bucket_run_eagerly(ckpt):
    eng = tiny_engine(ckpt, graph_emulation=True, num_pages=48, max_batch_size=8, max_num_batched_tokens=16,
                      max_context_len=64)  # fmt: skip
    ref = tiny_engine(ckpt, num_pages=48, max_batch_size=8, max_context_len=64)
    outs = []
    for e in (eng, ref):
        _, h, res, _ = _drive(e, [2], chunk=15)  # 15 + 1 = 16: exactly the largest bucket
        _, h2, res2, _ = _drive(e, [3], chunk=14)  # 14 + 1 = 15 after a 3-token prefill
        outs.append((h, res.next_token_ids.tolist(), h2, res2.next_token_ids.tolist()))
    (h, a, h2, b), (_, a_ref, _, b_ref) = outs
    assert h.varlen_bucket == 16 and a == a_ref and b == b_ref
    _, h3, _, _ = _drive(eng, [1], chunk=16)  # 17 tokens: one over the largest bucket
    assert h3.varlen_bucket is None and h3.graph_bucket is None and h3.eager_tokens == 17


@cuda_only()
def test_captured_varlen_graph_prefill_beside_decode_rows_matches_torch(tmp_path):
    """The live NaN step on real CUDA graphs (the interpreter check is in test_engine_triton_ops.py): 3 decode rows
    and a sampled 38-token prefill in the 48-token varlen graph, a block table wide enough that both row groups
    split the KV; logits as the torch attention path's eager pass gives them."""
    make_hf_checkpoint(tmp_path, seed=31, max_position_embeddings=1024)
    kw = {"device": "cuda", "page_size": 16, "num_pages": 64, "max_batch_size": 8, "max_num_batched_tokens": 64}
    graphed = tiny_engine(tmp_path, attention_backend="triton", cuda_graphs=True, **kw)
    assert graphed.graphs_enabled, graphed.graph_error
    h, res = decode_rows_beside_prefill(graphed, [3, 5, 2], 38)
    ref_engine = tiny_engine(tmp_path, ops_backend="torch", **kw)  # torch attention (tiny_engine's default), eager
    _, ref = decode_rows_beside_prefill(ref_engine, [3, 5, 2], 38)
    assert h.varlen_bucket == 48 and torch.isfinite(res.logits).all()
    assert res.next_token_ids.tolist() == ref.next_token_ids.tolist()
    assert float((res.logits - ref.logits).abs().max()) < 1e-3 * float(ref.logits.abs().max())
