"""Engine plumbing: KV sizing and the shared pool, host-side packing and bucket padding, batch errors,
two engines in one process, and (CUDA only) graph capture/replay against the eager path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cuda_marks import cuda_only as cuda_only_mark
from engine_testlib import Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.kv import KVPool
from tokenrouter.core.request import Request
from tokenrouter.engine.base import ModelRunner
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.kv_cache import kv_bytes_per_page
from tokenrouter.engine.runner import Engine
from tokenrouter.engine.step_plan import plan_step

cuda_only = cuda_only_mark()


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


def _plan(eng, batch):
    return plan_step(batch, eng.plan_context(), lambda g, e: np.empty(g + e + 64, np.int32))


def _fields(part):
    return {k: part.packed[o : o + n] for k, (o, n) in part.layout.offsets().items()}


def test_graph_part_pads_into_the_null_page_and_reads_pages_through_slots(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, graph_emulation=True, graph_buckets=(1, 2, 4, 8))
    pool = eng.kv_pool
    a, b = _req("a", 6, pool), _req("b", 3, pool, extra=2)
    b.token_ids += [50, 51]
    plan = _plan(eng, Batch(0, 0, [BatchRow(a, 5, 1), BatchRow(b, 3, 2)]))  # a decode row and a 2-token extend
    assert plan.eager is None and plan.graph.bucket == 4
    f = _fields(plan.graph)
    assert f["input_ids"].tolist() == [6, 50, 51, 0]
    assert f["positions"].tolist() == [5, 3, 4, 0]
    slot = lambda req, p: req.pages[p // 4] * 4 + p % 4  # noqa: E731
    assert f["slot_mapping"].tolist() == [slot(a, 5), slot(b, 3), slot(b, 4), 0]
    assert f["seq_lens"].tolist() == [6, 4, 5, 1]  # one virtual decode row per token, padding reads 1 token
    sa, sb = plan.table.slots
    assert sa != sb and 0 not in (sa, sb)
    assert f["row_slots"].tolist() == [sa, sb, sb, 0]  # page tables by slot: no per-token table
    assert f["logits_indices"].tolist() == [0, 2, 0, 0] and f["out_slot"].tolist() == [sa, sb, 0, 0]
    assert f["prev"].tolist() == [-1, -1, -1, -1]
    w = eng.table.width
    writes = dict(zip(f["upd_idx"].tolist(), f["upd_val"].tolist(), strict=True))
    assert writes[sa * w] == a.pages[0] and writes[sa * w + 1] == a.pages[1] and writes[sb * w + 1] == b.pages[1]
    assert plan.out_index.tolist() == [0, 1]


def test_mixed_batch_keeps_short_rows_in_the_graph(ckpt):
    """The split option (graph_split=True), with the varlen part eager (varlen_graphs=False): its exact layout."""
    _, path = ckpt
    eng = tiny_engine(path, graph_emulation=True, graph_buckets=(1, 2, 4, 8), graph_split=True, varlen_graphs=False)
    pool = eng.kv_pool
    d, p, c = _req("d", 5, pool), _req("p", 12, pool), _req("c", 20, pool)
    rows = [BatchRow(d, 4, 1), BatchRow(p, 0, 12), BatchRow(c, 0, 9, sample=False)]
    plan = _plan(eng, Batch(0, 0, rows))
    assert plan.graph.rows == [0] and plan.eager.rows == [1, 2] and plan.graph.bucket == 1
    f = _fields(plan.eager)
    assert f["cu_seqlens_q"].tolist() == [0, 12, 21] and f["seq_lens"].tolist() == [12, 9]
    assert f["logits_indices"].tolist() == [11]  # only the sampling row gets a logit row
    assert plan.out_index.tolist() == [0, eng.eager_out_base, -1]
    res = eng.step(Batch(0, 0, rows)).result()
    assert res.next_token_ids[2] == -1 and res.next_token_ids[:2].min() >= 0
    # Graphs off: everything eager, same tokens.
    ref = tiny_engine(path)
    for r in (d, p, c):
        r.pages.clear()
        ref.kv_pool.grow(r.pages, r.num_tokens)
    assert ref.step(Batch(0, 0, rows)).result().next_token_ids.tolist() == res.next_token_ids.tolist()
    # The default (no split, varlen graphs): the whole step in one varlen graph, same tokens.
    one = tiny_engine(path, graph_emulation=True, graph_buckets=(1, 2, 4, 8))
    for r in (d, p, c):
        r.pages.clear()
        one.kv_pool.grow(r.pages, r.num_tokens)
    plan = _plan(one, Batch(0, 0, rows))
    # 22 tokens: the 24-token bucket (1.5x midpoints); all rows <= short_q 16
    assert plan.graph is None and plan.eager.bucket == 24 and plan.eager.rows == [0, 1, 2]
    assert one.step(Batch(0, 0, rows)).result().next_token_ids.tolist() == res.next_token_ids.tolist()


def test_page_tables_change_incrementally(ckpt):
    """Rows keep their slots; a decode step writes a page only when the row crosses into a new page."""
    _, path = ckpt
    eng = tiny_engine(path, graph_emulation=True)
    pool = eng.kv_pool
    req = _req("a", 6, pool)
    eng.step(Batch(0, 0, [BatchRow(req, 0, 6)])).result()
    slot = eng.table.slot_of(req)
    writes = []
    for pos in range(6, 12):
        req.token_ids.append(3)
        pool.grow(req.pages, pos + 1)
        plan = _plan(eng, Batch(0, pos, [BatchRow(req, pos, 1)]))
        writes.append(plan.table.upd_val)
        eng.step(Batch(0, pos, [BatchRow(req, pos, 1)])).result()
        assert eng.table.slot_of(req) == slot
    assert writes == [[], [], [req.pages[2]], [], [], []]  # position 8 opens page 2
    assert eng.table.table[slot, :3].tolist() == req.pages[:3]


def _refused(eng, batch: Batch, match: str) -> tuple[str, ...]:
    """The requests a refused batch's BatchError names (`rids`: what the runtime fails)."""
    with pytest.raises(BatchError, match=match) as err:
        eng.step(batch)
    return err.value.rids


def test_bad_inputs_name_the_row(ckpt):
    _, path = ckpt
    eng = tiny_engine(path)
    pool = eng.kv_pool
    a, b = _req("a", 3, pool, extra=1), _req("b", 3, pool)
    assert _refused(eng, Batch(0, 1, [BatchRow(a, 3, 1, from_prev=True)]),
                    "row 0 \\(request a\\): from_prev row, but step 0") == ("a",)  # fmt: skip
    a.token_ids[1] = eng.spec.vocab_size
    assert _refused(eng, Batch(0, 1, [BatchRow(b, 0, 3), BatchRow(a, 0, 3)]),
                    "row 1 \\(request a\\): token id 256 outside the vocabulary") == ("a",)  # fmt: skip
    a.token_ids[1] = 2
    assert _refused(eng, Batch(0, 1, [BatchRow(a, 0, 5)]), "row 0 \\(request a\\): 1 KV pages cannot hold 5") == ("a",)
    assert _refused(eng, Batch(0, 1, [BatchRow(a, 0, 200)]), "beyond max_context_len") == ("a",)
    assert _refused(eng, Batch(0, 1, []), "empty") == ()  # the batch as a whole
    assert _refused(
        eng, Batch(0, 1, [BatchRow(a, 0, 3), BatchRow(a, 0, 3)]), "rows 0 and 1: request a appears twice"
    ) == ("a",)
    saved = list(a.pages)
    for bad, match, rids in (([0], "page id 0", ("a",)), ([eng.num_pages], f"page id {eng.num_pages}", ("a",)),
                             ([b.pages[0]], "both hold", ("a", "b"))):  # fmt: skip
        a.pages[:] = bad
        with pytest.raises(BatchError, match=match) as err:
            eng.step(Batch(0, 1, [BatchRow(b, 0, 3), BatchRow(a, 0, 3)]))
        assert "row 1 (request a)" in str(err.value) and err.value.rids == rids
    a.pages[:] = saved
    # Nothing changed: the same batch now runs.
    eng.step(Batch(0, 1, [BatchRow(b, 0, 3), BatchRow(a, 0, 3)])).result()


def test_stale_rows_are_skipped_not_fatal(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, graph_emulation=True)
    pool = eng.kv_pool
    a, b = _req("a", 3, pool), _req("b", 4, pool)
    rows = [BatchRow(a, 0, 3, version=0), BatchRow(b, 0, 4, version=0)]
    a.version += 1  # finished/aborted/hopped between schedule and step
    pool.release(a.pages)
    handle = eng.step(Batch(0, 0, rows))
    res = handle.result()
    assert handle.skipped_rows == [0] and res.next_token_ids[0] == -1 and res.next_token_ids[1] >= 0


def test_batch_limits(ckpt):
    _, path = ckpt
    eng = tiny_engine(path, max_batch_size=2)
    reqs = [_req(f"r{i}", 2, eng.kv_pool) for i in range(3)]
    assert _refused(eng, Batch(0, 0, [BatchRow(r, 0, 2) for r in reqs]), "max_batch_size") == ()  # no row at fault


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


def test_memory_budget_sizes_the_kv_cache_and_close_frees(ckpt):
    import weakref

    from tokenrouter.engine.errors import EngineError
    from tokenrouter.engine.memory import MemoryProfile, kv_bytes_for_budget

    prof = MemoryProfile(weights=100 << 20, activation_peak=50 << 20, static=10 << 20)
    assert kv_bytes_for_budget(1 << 30, prof) == (1 << 30) - (160 << 20) - int(0.02 * (1 << 30)) - (64 << 20)
    _, path = ckpt
    budget = 96 << 20
    eng = tiny_engine(path, num_pages=None, memory_budget_bytes=budget)
    rep = eng.memory_report()
    per_page = kv_bytes_per_page(eng.spec, 4, torch.float32)
    assert rep.budget == budget and rep.weights > 0
    expect = kv_bytes_for_budget(budget, MemoryProfile(rep.weights, 0, eng.memory_profile.static)) // per_page
    assert eng.num_pages == expect and rep.kv_cache == expect * per_page
    assert rep.weights + rep.kv_cache + rep.page_table < budget
    with pytest.raises(EngineError, match="no room"):
        tiny_engine(path, num_pages=None, memory_budget_bytes=1 << 20)
    kv = weakref.ref(eng.kv_cache.kv)
    eng.close()
    assert kv() is None  # the engine held the last reference
    req = _req("z", 2, KVPool(8, 4))
    with pytest.raises(EngineError, match="closed"):
        eng.step(Batch(0, 0, [BatchRow(req, 0, 2)]))


def test_colocation_options():
    cfg = EngineConfig("qwen3-0.6b", mps_active_thread_percentage=40)
    assert cfg.mps_environment() == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"}
    assert EngineConfig("qwen3-0.6b").mps_environment() == {}
    for bad in ({"mps_active_thread_percentage": 0}, {"green_context_sms": 0}, {"gpu_memory_utilization": 1.5},
                {"num_pages": 10, "memory_budget_bytes": 1 << 30}):  # fmt: skip
        with pytest.raises(ValueError):
            EngineConfig("qwen3-0.6b", **bad)
    rule = EngineConfig("qwen3-0.6b", graph_buckets=(1, 4), graph_max_row_tokens=2, graph_split=True).graph_rule()
    assert rule.buckets == (1, 4) and rule.max_row_tokens == 2 and rule.split([1, 3, 2, 2]) == ([0, 2], [1, 3])
    rule = EngineConfig("qwen3-0.6b", graph_buckets=(1, 4), graph_max_row_tokens=2).graph_rule()  # default: one pass
    assert not rule.allow_split and rule.split([1, 3, 2, 2]) == ([], [0, 1, 2, 3])
