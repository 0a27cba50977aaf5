"""Learned routers in the loop: core schedulers + CPU engines (tiny models, dummy weights), driven in one
process the way the runtime drives its subservers. Every committed token is checked against a fresh
prefill of its prefix on the model that wrote it (an independent path through the engine), and the hop
pattern against the router's own rule recomputed from that prefill.

The core `Scheduler` calls the two hooks the ensemble needs (`select_tokens` in complete, `receive` on a first
visit); `HookedScheduler` can switch the second off to show what it carries. The engine's device-part call
site is emulated in `drive`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenrouter.core.batch import Batch, BatchRow  # noqa: E402
from tokenrouter.core.messages import Emit, Finish, Send  # noqa: E402
from tokenrouter.core.request import Request, SamplingParams  # noqa: E402
from tokenrouter.core.scheduler import Scheduler  # noqa: E402
from tokenrouter.engine import Engine, EngineConfig  # noqa: E402
from tokenrouter.routers.learned import calibrate_on_runner, make_learned_router  # noqa: E402


class HookedScheduler(Scheduler):
    """The core Scheduler, optionally without the first-visit `router.receive` call (to show what it carries)."""

    def __init__(self, *a, first_visit_receive: bool = True, **kw) -> None:
        super().__init__(*a, **kw)
        if not first_visit_receive:
            self.router = _NoFirstReceive(self.router, self)


class _NoFirstReceive:
    """Router proxy that skips `receive` for a request's first message at a subserver (`loc == 0`: the whole
    sequence travels), as the scheduler once did."""

    def __init__(self, router, sched) -> None:
        self._r = router

    def receive(self, msg, req):
        return None if msg.loc == 0 else self._r.receive(msg, req)

    def __getattr__(self, name):
        return getattr(self._r, name)


def engine(name: str, seed: int = 0) -> Engine:
    return Engine(EngineConfig(model=name, load_format="dummy", device="cpu", num_pages=48, seed=seed))


@pytest.fixture(scope="module")
def pair():
    return [engine("tiny-small"), engine("tiny-large")]


def drive(engines, routers, prompts, sampling, first_visit_receive=True):
    """Run the requests to completion; returns {rid: [(token, writer model), ...]} in output order."""
    n = len(engines)
    scheds = [
        HookedScheduler(i, n, kv=e.kv_pool, router=r, first_visit_receive=first_visit_receive)
        for i, (e, r) in enumerate(zip(engines, routers, strict=True))
    ]
    for e, s in zip(engines, scheds, strict=True):
        e.set_router(s.router.device)  # the engine runs the device part inside its step
    out: dict[str, dict[int, tuple[int, int]]] = {}
    inbox: list[deque] = [deque() for _ in range(n)]
    done: set[str] = set()

    def handle(acts):
        for a in acts:
            if isinstance(a, Send):
                inbox[a.peer].append(a.msg)
            elif isinstance(a, Emit):
                for k, t in enumerate(a.tokens):
                    out[a.rid][a.pos + k] = (t, a.model)
            elif isinstance(a, Finish):
                done.add(a.rid)

    for i, p in enumerate(prompts):
        handle(scheds[0].add(Request(f"q{i}", list(p), len(p), sampling, num_models=n)))
        out[f"q{i}"] = {}

    for _ in range(2000):
        if len(done) == len(prompts) and not any(inbox):
            break
        for i, s in enumerate(scheds):
            while inbox[i]:
                handle(s.resume(inbox[i].popleft()))
            b = s.schedule(0.0)
            if b is None:
                continue
            res = engines[i].step(b, return_logits=s.router.needs_logits).result()
            handle(s.complete(b, res))
    else:
        raise AssertionError("requests did not finish")
    assert all(e.kv_pool.num_free == e.kv_pool.num_pages - 1 for e in engines)  # every page came back (one is null)
    return {rid: [v[k] for k in sorted(v)] for rid, v in out.items()}


def prefill(eng: Engine, ids: list[int]) -> torch.Tensor:
    """Logits after `ids`, from a fresh full prefill (independent of the incremental run)."""
    req = Request("_ref", list(ids), len(ids))
    assert eng.kv_pool.grow(req.pages, len(ids))
    try:
        return eng.step(Batch(0, 0, [BatchRow(req, 0, len(ids))]), return_logits=True).result().logits[0].double()
    finally:
        eng.kv_pool.release(req.pages)


def norm_entropy(logits: torch.Tensor) -> float:
    p = torch.softmax(logits, -1)
    return float(-(torch.special.xlogy(p, p)).sum() / math.log(len(p)))


PROMPTS = [[5, 17, 300, 42, 9, 77, 1000, 3], [400, 401, 402, 12, 13, 600, 2, 8, 8, 91, 250]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_r2r_random_on_the_tiny_pair(pair):
    small = pair[0]
    spec = small.spec
    emb = small.model.embed_tokens

    def routers():
        rs = [
            make_learned_router(
                "r2r",
                "random",
                0.3,
                spec.hidden_size,
                spec.vocab_size,
                "cpu",
                model=m,
                embedding=emb,
                calibration_rows=128,
            )
            for m in (0, 1)
        ]
        rs[0].bind(0, 2)
        calibrate_on_runner(rs[0], small, num_prompts=8, prompt_len=8)
        return rs

    first = drive(pair, routers(), PROMPTS, GREEDY)
    again = drive(pair, routers(), PROMPTS, GREEDY)
    assert first == again  # temperature 0: same prompt, same text and the same writers
    writers = [m for seq in first.values() for _, m in seq]
    assert 0 < writers.count(1) < len(writers)
    for p, seq in zip(PROMPTS, first.values(), strict=True):
        assert len(seq) == GREEDY.max_tokens
        ids = list(p)
        for k, (tok, m) in enumerate(seq):
            if m == 1:
                assert k + 1 == len(seq) or seq[k + 1][1] == 0  # the large model hands back after one token
            assert tok == int(prefill(pair[m], ids).argmax())  # each writer's greedy token for this prefix
            ids.append(tok)


def test_r_stitch_runs_follow_entropy(pair):
    small = pair[0]
    rs = [
        make_learned_router("r-stitch", "random", 0.35, return_prob=0.5, model=m, calibration_rows=96) for m in (0, 1)
    ]
    for m, eng in enumerate(pair):
        rs[m].bind(m, 2)
        calibrate_on_runner(rs[m], eng, num_prompts=8, prompt_len=8)
    taus = [float(r.gate.threshold) for r in rs]
    out = drive(pair, rs, PROMPTS, GREEDY)
    # Replay R-Stitch's rule from fresh prefills: the small model hops (dropping its token) when its entropy
    # is > tau_small; the large model writes, and keeps writing while its entropy is > tau_large.
    for p, seq in zip(PROMPTS, out.values(), strict=True):
        ids, owner, want = list(p), 0, []
        for _ in seq:
            if owner == 0 and norm_entropy(prefill(small, ids)) > taus[0]:
                owner = 1
            logits = prefill(pair[owner], ids)
            want.append((int(logits.argmax()), owner))
            ids.append(want[-1][0])
            if owner == 1 and norm_entropy(logits) <= taus[1]:
                owner = 0
        assert seq == want
    assert any(m == 1 for seq in out.values() for _, m in seq)


@pytest.mark.parametrize("first_visit_receive", [True, False])
def test_ensemble_commits_the_weighted_choice(pair, first_visit_receive):
    third = engine("tiny-small", seed=7)
    engines = [pair[0], pair[1], third]
    weights, k = [0.5, 0.3, 0.2], 12
    rs = [make_learned_router("me", None, num_models=3, ensemble_weights=weights, ensemble_top_k=k) for _ in range(3)]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    out = drive(engines, rs, PROMPTS, sp, first_visit_receive=first_visit_receive)
    if not first_visit_receive:  # without the scheduler's first-visit receive, model 1 loses model 0's scores
        assert rs[1].num_uncarried > 0
        return
    assert rs[1].num_uncarried == rs[2].num_uncarried == 0
    for p, seq in zip(PROMPTS, out.values(), strict=True):
        ids = list(p)
        for tok, m in seq:
            assert m == 2  # only the last model commits
            logp = [torch.log_softmax(prefill(e, ids), -1) for e in engines]
            cand = logp[0].topk(k).indices
            combined = sum(w * lp[cand] for w, lp in zip(weights, logp, strict=True))
            assert tok == int(cand[int(combined.argmax())])
            ids.append(tok)
    # sampled ensemble: same seed, same text
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=5, ignore_eos=True)
    a = drive(engines, [make_learned_router("me", None, num_models=3) for _ in range(3)], PROMPTS, sp)
    b = drive(engines, [make_learned_router("me", None, num_models=3) for _ in range(3)], PROMPTS, sp)
    assert a == b
    assert np.all([m == 2 for seq in a.values() for _, m in seq])
    third.close()
