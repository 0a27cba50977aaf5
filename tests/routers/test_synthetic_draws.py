"""The synthetic router's hop draws are keyed by (request, output index, model), not taken from a stream: a request
hops at the same tokens whatever it was batched with, and the draws still follow the hop rate independently."""

from __future__ import annotations

import math

from tokenrouter.core.batch import Batch, BatchRow, StepResult
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.routers.synthetic import ProbRouter


def _router(p: float, model: int = 0, seed: int = 0) -> ProbRouter:
    return ProbRouter([[1 - p, p], [1.0, 0.0]], [[True, False], [True, True]], seed).bind(model, 2)


def _req(rid: str, prompt: list[int], seed: int | None = None) -> Request:
    return Request(rid, list(prompt), len(prompt), SamplingParams(max_tokens=1000, seed=seed))


def _decisions(router: ProbRouter, reqs: list[Request], steps: int) -> dict[str, list[int]]:
    """Route `reqs` together for `steps` tokens (each step appends one output token to every request)."""
    out: dict[str, list[int]] = {r.rid: [] for r in reqs}
    for _ in range(steps):
        batch = Batch(0, 0, [BatchRow(r, r.num_tokens - 1, 1) for r in reqs])
        for r, d in zip(reqs, router.route(batch, StepResult([0] * len(reqs))), strict=True):
            out[r.rid].append(d)
            r.token_ids.append(7)
    return out


def test_a_requests_hops_do_not_depend_on_what_it_is_batched_with() -> None:
    alone = _decisions(_router(0.3), [_req("a", [1, 2, 3], seed=5)], 200)["a"]
    crowd = [_req(f"x{i}", [9, i], seed=i) for i in range(6)]
    batched = _decisions(_router(0.3), [*crowd[:3], _req("a", [1, 2, 3], seed=5), *crowd[3:]], 200)["a"]
    assert batched == alone
    assert 0 < sum(alone) < 200  # it does hop, and not always


def test_the_draws_follow_the_hop_rate_independently() -> None:
    p, n_req, steps = 0.2, 400, 50
    dec = _decisions(_router(p), [_req(f"r{i}", [3, i, i // 7], seed=i) for i in range(n_req)], steps)
    seqs = list(dec.values())
    n = n_req * steps
    hops = sum(map(sum, seqs))
    assert abs(hops / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    # A hop says nothing about the next token's draw: P(hop at i+1 | hop at i) is p too.
    pairs = [(s[i], s[i + 1]) for s in seqs for i in range(steps - 1)]
    after = [b for a, b in pairs if a == 1]
    assert abs(sum(after) / len(after) - p) < 4 * math.sqrt(p * (1 - p) / len(after))


def test_the_key_is_the_seed_and_prompt_or_without_a_seed_the_id() -> None:
    def seq(req: Request, router_seed: int = 0) -> list[int]:
        return _decisions(_router(0.5, seed=router_seed), [req], 64)[req.rid]

    assert seq(_req("a", [1, 2], seed=3)) == seq(_req("b", [1, 2], seed=3))  # a repeated seeded request
    assert seq(_req("a", [1, 2], seed=3)) == seq(_req("a", [1, 2], seed=3), router_seed=9)
    assert seq(_req("a", [1, 2], seed=3)) != seq(_req("a", [1, 2], seed=4))
    assert seq(_req("a", [1, 2], seed=3)) != seq(_req("a", [1, 5], seed=3))
    # Unseeded (most clients): the id and the router's seed decide, so identical prompts still hop apart.
    assert seq(_req("a", [1, 2])) != seq(_req("b", [1, 2]))
    assert seq(_req("a", [1, 2])) == seq(_req("a", [1, 2]))
    assert seq(_req("a", [1, 2])) != seq(_req("a", [1, 2]), router_seed=1)


def test_each_model_draws_its_own_decisions() -> None:
    req = _req("a", [4, 4], seed=1)
    on_small = _decisions(_router(0.5, model=0), [req], 64)["a"]
    router = ProbRouter([[0.5, 0.5], [0.5, 0.5]], [[True, True], [True, True]]).bind(1, 2)
    on_large = _decisions(router, [_req("a", [4, 4], seed=1)], 64)["a"]
    assert [1 - d for d in on_small] != on_large  # not the small model's draws mirrored


def test_a_certain_destination_draws_nothing() -> None:
    large = _router(0.3, model=1)
    req = _req("a", [1], seed=0)
    assert _decisions(large, [req], 20)["a"] == [0] * 20
    assert req.hop_key is None  # no key was made: nothing was drawn
