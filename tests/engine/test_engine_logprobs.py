"""Log-probabilities (`SamplingParams.logprobs = k`) from the engine's step against an independent reference: fp64
log-softmax of the logits the same step returns (`return_logits=True`), top k in descending order (ties by id),
in a batch that mixes rows that ask (k = 0, 1, 3, 20; greedy and sampled) with rows that do not, prefill chunks,
decode steps (the planner's fast path) and extend rows, on the eager pass and the emulated graphs. Asking changes
no token. The CUDA test runs the same on real graphs under sync-debug "error" (no host sync)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cuda_marks import cuda_only
from engine_testlib import make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams

PARAMS = [
    SamplingParams(logprobs=3),
    SamplingParams(),
    SamplingParams(temperature=0.9, seed=4, logprobs=20),
    SamplingParams(temperature=1.2, top_k=7, seed=5),
    SamplingParams(logprobs=0),
    SamplingParams(temperature=0.8, top_p=0.9, seed=6, logprobs=1),
]
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18, 19, 20, 21, 22, 23], [24]]
MODES = {
    "eager": {},
    "varlen-graphs": {"graph_emulation": True},
    "decode-graphs-split": {"graph_emulation": True, "graph_split": True, "varlen_graphs": False},
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3lp")
    make_hf_checkpoint(path, seed=8)
    return path


def _requests(ask: bool) -> list[Request]:
    out = []
    for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS, strict=True)):
        sp = sp if ask else dataclasses.replace(sp, logprobs=None)
        out.append(Request(f"l{i}", list(p), len(p), sampling=sp))
    return out


def _steps(reqs: list[Request]):
    """Step 0: prefill (request 4 as a partial chunk that samples nothing); step 1: the rest of request 4's
    prompt; step 2: decode rows only (the planner's fast path on the graph engines); step 3: decode rows beside
    3-token extend rows; step 4: decode rows only of requests that do not ask."""
    yield [BatchRow(r, 0, r.num_tokens if i != 4 else 3, sample=i != 4) for i, r in enumerate(reqs)]
    yield [BatchRow(reqs[4], 3, reqs[4].num_tokens - 3)]
    yield [BatchRow(r, r.num_computed, 1) for r in reqs]
    for r in reqs[::2]:
        r.token_ids += [30, 31]  # a peer's tokens: extend rows of 3
    yield [BatchRow(r, r.num_computed, r.num_new) for r in reqs]
    yield [BatchRow(r, r.num_computed, 1) for r in (reqs[1], reqs[3])]


def _run(eng, ask: bool):
    reqs = _requests(ask)
    for r in reqs:
        eng.kv_pool.grow(r.pages, 16)
    results = []
    for step, rows in enumerate(_steps(reqs)):
        res = eng.step(Batch(0, step, rows), return_logits=True).result()
        results.append((rows, res))
        for row, tok in zip(rows, res.next_token_ids.tolist(), strict=True):
            row.req.num_computed = row.start + row.num_tokens
            if row.sample:
                row.req.token_ids.append(tok)
    return results


def _check(asked, plain, tol: float) -> None:
    checked = set()
    for step, ((rows, res), (_, ref)) in enumerate(zip(asked, plain, strict=True)):
        assert res.next_token_ids.tolist() == ref.next_token_ids.tolist(), step
        assert torch.equal(res.logits, ref.logits) and ref.logprobs is None
        logits = dict(zip(res.logit_rows, res.logits, strict=True))
        wants = [row.sample and row.req.sampling.logprobs is not None for row in rows]
        if not any(wants):
            assert res.logprobs is None, step
            continue
        assert len(res.logprobs) == len(rows)
        for i, (row, want) in enumerate(zip(rows, wants, strict=True)):
            got = res.logprobs[i]
            if not want:
                assert got is None, (step, i)
                continue
            k = row.req.sampling.logprobs
            x = logits[i]
            lp = torch.log_softmax(x.double(), dim=-1)
            tok = int(res.next_token_ids[i])
            assert abs(got.logprob - float(lp[tok])) < tol, (step, i)
            order = sorted(range(x.numel()), key=lambda t: (-float(x[t]), t))[:k]  # value desc, ties by id
            assert [t for t, _ in got.top] == order, (step, i)
            assert all(abs(v - float(lp[t])) < tol for t, v in got.top), (step, i)
            assert all(a[1] >= b[1] for a, b in zip(got.top, got.top[1:], strict=False))
            checked.add((step, k, row.num_tokens > 1, row.req.sampling.temperature > 0))
    ks = {k for _, k, _, _ in checked}
    assert ks == {0, 1, 3, 20} and any(e for _, _, e, _ in checked) and any(not e for _, _, e, _ in checked)
    assert {s for s, _, _, _ in checked} == {0, 1, 2, 3} and any(t for _, _, _, t in checked)


@pytest.mark.parametrize("mode", list(MODES))
def test_logprobs_match_the_step_logits_and_change_no_token(ckpt, mode, monkeypatch):
    from tokenrouter.engine import step_plan

    fast = []
    real = step_plan.plan_decode

    def counting(*a, **kw):
        plan = real(*a, **kw)
        fast.append(plan is not None and bool(plan.logprobs))
        return plan

    monkeypatch.setattr(step_plan, "plan_decode", counting)
    _check(_run(tiny_engine(ckpt, **MODES[mode]), ask=True), _run(tiny_engine(ckpt, **MODES[mode]), ask=False), 1e-5)
    assert any(fast) == (mode != "eager")  # the decode step with logprob rows took the fast path


def test_logprobs_without_return_logits_and_without_graph_outputs(ckpt):
    eng = tiny_engine(ckpt)
    req = Request("a", [3, 4, 5], 3, sampling=SamplingParams(logprobs=2))
    eng.kv_pool.grow(req.pages, 8)
    res = eng.step(Batch(0, 0, [BatchRow(req, 0, 3)])).result()
    assert res.logits is None and len(res.logprobs) == 1 and len(res.logprobs[0].top) == 2
    assert res.logprobs[0].top[0][0] == int(res.next_token_ids[0])  # greedy: the argmax is the top token


@cuda_only()
def test_logprobs_in_cuda_graphs_without_a_host_sync(ckpt):
    """Real graphs and the Triton sampler (bf16 logits: many ties, ordered by id), launched under sync-debug
    "error"; the reference is the same fp64 recomputation from the returned logits."""
    kw = {"device": "cuda", "dtype": "bfloat16", "attention_backend": "auto", "cuda_graphs": True}
    engines = (tiny_engine(ckpt, **kw), tiny_engine(ckpt, **kw))
    torch.cuda.set_sync_debug_mode("error")
    try:
        asked, plain = _run(engines[0], ask=True), _run(engines[1], ask=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    _check(asked, plain, 2e-3)
