"""Acceptance: the core `Scheduler` drives the engine as a subserver does, with overlap, a pool small enough to
preempt and reuse pages, peer returns (2-4 token extend rows), prefill chunks, mixed sampling parameters, and
aborts / finishes / hand-offs landing between schedule and step. Every request that was not aborted must end
with exactly the tokens of a roomy run without overlap. Plus: a failed step never feeds a later from_prev row
an older token, and the engine stays usable after it."""

from __future__ import annotations

import pytest
import torch
from cuda_marks import cuda_only
from engine_testlib import make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.scheduler import Scheduler
from tokenrouter.engine.errors import BatchError, StepFailed
from tokenrouter.runtime.local_loop import EchoPeer, LocalLoop, PositionHopRouter

PARAMS = [
    SamplingParams(max_tokens=9),
    SamplingParams(temperature=0.8, seed=1, max_tokens=8),
    SamplingParams(temperature=1.2, top_k=5, seed=2, max_tokens=10),
    SamplingParams(temperature=1.0, top_p=0.7, seed=3, max_tokens=7),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=4, max_tokens=9),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3serve")
    make_hf_checkpoint(path, seed=21)
    return path


def _requests(vocab: int, n: int = 10) -> list[Request]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        plen = [3, 17, 6, 11, 25, 4, 9, 14, 2, 20][i % 10]
        ids = torch.randint(0, vocab, (plen,), generator=g).tolist()
        out.append(Request(f"r{i}", ids, plen, sampling=PARAMS[i % len(PARAMS)]))
    return out


def _run(path, *, emulate: bool, pages: int, overlap: bool, complete_first: bool = False, aborts=(), **engine_kw):
    eng = tiny_engine(path, graph_emulation=emulate, num_pages=pages, max_batch_size=8, **engine_kw)
    sched = Scheduler(0, 2, kv=eng.kv_pool, router=PositionHopRouter(period=4), max_batch_size=8,
                      max_batch_tokens=12, overlap=overlap)  # fmt: skip
    reqs = _requests(eng.spec.vocab_size)
    for r in reqs:
        sched.add(r)
    aborted: set[str] = set()

    def between(batch: Batch) -> None:  # an abort lands between schedule and step
        for rid, at in aborts:
            if sched.step_id == at and rid in sched.reqs:
                sched.abort(rid)
                aborted.add(rid)

    loop = LocalLoop(eng, sched, complete_first=complete_first, between=between, keep_handles=True,
                     peer=EchoPeer(eng.spec.vocab_size, delay=2))  # fmt: skip
    loop.run(max_steps=2000)
    outs = {r.rid: r.token_ids[r.prompt_len :] for r in reqs if r.rid not in aborted}
    return outs, loop, sched, aborted


MODES = {  # engine settings per mode; graph emulation runs the padded static-buffer path of every graph eagerly
    "eager": {"emulate": False},
    "varlen-graphs": {"emulate": True},  # the default: no split, every non-decode step in one varlen graph
    "varlen-graphs-split": {"emulate": True, "graph_split": True},
    "decode-graphs-split": {"emulate": True, "graph_split": True, "varlen_graphs": False},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("complete_first", [False, True], ids=["launch-first", "complete-first"])
def test_scheduler_driven_overlap_matches_roomy_reference(ckpt, mode, complete_first):
    kw = dict(MODES[mode])
    emulate = kw.pop("emulate")
    ref, ref_loop, ref_sched, _ = _run(ckpt, emulate=False, pages=400, overlap=False)
    assert ref_sched.num_preemptions == 0 and len(ref_loop.finished) == 10
    outs, loop, sched, aborted = _run(ckpt, emulate=emulate, pages=24, overlap=True, complete_first=complete_first,
                                       aborts=[("r3", 6), ("r7", 11)], **kw)  # fmt: skip
    assert sched.num_preemptions > 0  # the small pool preempted and pages were reused
    assert aborted == {"r3", "r7"} and "r3" not in loop.finished
    assert any(h.skipped_rows for h in loop.handles)  # stale rows reached the engine and were skipped
    assert any(r.from_prev for h in loop.handles for r in h.batch.rows)
    assert sum(1 for h in loop.handles for r in h.batch.rows if 2 <= r.num_tokens <= 4) > 3  # peer returns
    long_steps = [h for h in loop.handles if any(r.num_tokens > 8 for r in h.batch.rows)]
    assert long_steps  # prefill chunks beyond the decode graphs' row limit
    if kw.get("graph_split"):
        mixed = [h for h in loop.handles if h.graph_bucket is not None and h.eager_tokens]
        assert mixed  # steps with a prefill chunk kept their short rows in the decode graph
    if mode == "varlen-graphs":  # one pass per step: decode graph or one varlen graph, never both, never eager
        assert all((h.graph_bucket is None) != (h.varlen_bucket is None) for h in loop.handles)
        assert all(h.varlen_bucket is not None and h.eager_tokens == h.num_tokens for h in long_steps)
        assert any(any(r.num_tokens == 1 for r in h.batch.rows) for h in long_steps)  # decode rows in them
    if mode == "varlen-graphs-split":
        assert all(h.varlen_bucket is not None for h in loop.handles if h.eager_tokens)
    if mode in ("eager", "decode-graphs-split"):
        assert all(h.varlen_bucket is None for h in loop.handles)
    for rid, toks in outs.items():
        assert toks == ref[rid], rid
    assert set(outs) == set(ref) - aborted


def test_failed_step_never_feeds_an_older_token(ckpt, monkeypatch):
    eng = tiny_engine(ckpt, graph_emulation=True)
    pool = eng.kv_pool
    reqs = [Request(f"f{i}", [3, 4, 5, 6][: 2 + i], 2 + i) for i in range(2)]
    for r in reqs:
        pool.grow(r.pages, r.num_tokens + 4)
    first = eng.step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs])).result()
    for r, t in zip(reqs, first.next_token_ids.tolist(), strict=True):
        r.num_computed = r.num_tokens
        r.token_ids.append(t)
    # Step 1 (from_prev would be fine) fails mid-launch, as an out-of-memory error would.
    real = eng.fwd.forward

    def boom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(eng.fwd, "forward", boom)
    monkeypatch.setattr(eng.graphs, "forward", lambda *a: boom())
    with pytest.raises(StepFailed, match="step 1 failed: OutOfMemoryError"):
        eng.step(Batch(0, 1, [BatchRow(r, r.num_tokens - 1, 1) for r in reqs]))
    monkeypatch.setattr(eng.fwd, "forward", real)
    monkeypatch.undo()
    # Step 2's from_prev rows refer to the failed step 1: an error naming the row, not step 0's token.
    with pytest.raises(BatchError, match="row 0 \\(request f0\\): from_prev row, but step 1"):
        eng.step(Batch(0, 2, [BatchRow(r, r.num_tokens, 1, from_prev=True) for r in reqs]))
    # The engine is usable: redo step 1 with host tokens; it matches a fresh engine.
    redo = eng.step(Batch(0, 1, [BatchRow(r, r.num_tokens - 1, 1) for r in reqs]), return_logits=True).result()
    fresh = tiny_engine(ckpt)
    for r in reqs:
        r.pages.clear()
        fresh.kv_pool.grow(r.pages, r.num_tokens + 4)
    ref = fresh.step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs]), return_logits=True).result()
    assert redo.next_token_ids.tolist() == ref.next_token_ids.tolist()
    assert float((redo.logits - ref.logits).abs().max()) < 1e-4


@cuda_only()
def test_overlap_loop_never_syncs_on_cuda(ckpt):
    """The same loop on CUDA with graphs under sync-debug "error": no hidden host sync in plan/launch/complete."""
    eng = tiny_engine(ckpt, device="cuda", dtype="bfloat16", attention_backend="auto", cuda_graphs=True,
                      num_pages=24, max_batch_size=8)  # fmt: skip
    sched = Scheduler(0, 2, kv=eng.kv_pool, router=PositionHopRouter(period=4), max_batch_size=8,
                      max_batch_tokens=12, overlap=True)  # fmt: skip
    for r in _requests(eng.spec.vocab_size):
        sched.add(r)
    loop = LocalLoop(eng, sched, peer=EchoPeer(eng.spec.vocab_size, delay=2))
    torch.cuda.set_sync_debug_mode("error")
    try:
        loop.run(max_steps=2000)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(loop.finished) == 10
