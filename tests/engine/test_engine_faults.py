"""Fault injection (`engine/faults.py`): a failed step is a `StepFailed` the engine recovers from, a failed graph
build an `EngineError`, set per engine (two engines in one process do not share it)."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.errors import BatchError, EngineError, StepFailed


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3faults")
    make_hf_checkpoint(path, seed=5)
    return path


def _reqs(eng, n=2):
    reqs = [Request(f"q{i}", [3, 4, 5, 6, 7][: 3 + i], 3 + i) for i in range(n)]
    for r in reqs:
        eng.kv_pool.grow(r.pages, r.num_tokens + 4)
    return reqs


def _prefill(eng, reqs, step_id=0):
    return eng.step(Batch(0, step_id, [BatchRow(r, 0, r.num_tokens) for r in reqs]), return_logits=True)


@pytest.mark.parametrize("emulate", [False, True], ids=["eager", "graph-emulation"])
def test_a_configured_step_fails_once_and_the_engine_goes_on(ckpt, emulate):
    eng = tiny_engine(ckpt, graph_emulation=emulate, fail_step_ids=(1,))
    other = tiny_engine(ckpt, graph_emulation=emulate)  # same process, no faults
    reqs = _reqs(eng)
    first = _prefill(eng, reqs).result()
    for r, t in zip(reqs, first.next_token_ids.tolist(), strict=True):
        r.num_computed = r.num_tokens
        r.token_ids.append(t)
    decode = [BatchRow(r, r.num_tokens - 1, 1) for r in reqs]
    with pytest.raises(StepFailed, match="step 1 failed: InjectedFault: injected failure of step 1"):
        eng.step(Batch(0, 1, decode))
    with pytest.raises(BatchError, match="from_prev row, but step 1"):  # the failed step sampled nothing
        eng.step(Batch(0, 2, [BatchRow(r, r.num_tokens, 1, from_prev=True) for r in reqs]))
    redo = eng.step(Batch(0, 1, decode), return_logits=True).result()  # once: the same id now runs
    ref_reqs = _reqs(other)
    for r, src in zip(ref_reqs, reqs, strict=True):
        r.token_ids = list(src.token_ids)
        r.prompt_len = len(r.token_ids)
        other.kv_pool.grow(r.pages, r.num_tokens + 4)
    ref = _prefill(other, ref_reqs).result()
    assert redo.next_token_ids.tolist() == ref.next_token_ids.tolist()
    assert torch.allclose(redo.logits, ref.logits, atol=1e-4)


def test_fail_next_steps_on_a_live_engine(ckpt):
    eng = tiny_engine(ckpt)
    reqs = _reqs(eng, 1)
    eng.faults.fail_next_steps = 2
    for step_id in (7, 8):
        with pytest.raises(StepFailed, match=f"step {step_id} failed: InjectedFault"):
            _prefill(eng, reqs, step_id)
    assert _prefill(eng, reqs, 9).result().next_token_ids.shape == (1,)


def test_a_failed_graph_build_is_an_engine_error(ckpt):
    with pytest.raises(EngineError, match="CUDA graph capture failed \\(InjectedFault: injected graph capture"):
        tiny_engine(ckpt, graph_emulation=True, fail_captures=1)
    eng = tiny_engine(ckpt, fail_captures=1)  # no graphs to build: nothing fails
    assert eng.faults.fail_captures == 1
    with pytest.raises(ValueError, match="fail_captures"):
        tiny_engine(ckpt, fail_captures=-1)
