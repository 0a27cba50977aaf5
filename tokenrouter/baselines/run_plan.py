"""How many tokens a model writes before the request leaves it, asked of the router before a visit (a standard
server cannot stop mid-generation): the routed scheduler's decision sequence, for synthetic routers only."""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.core.batch import Batch, BatchRow, StepResult
from tokenrouter.core.request import Request
from tokenrouter.core.router import Router

_PROBE = 0  # stands for a token not sampled yet: synthetic routers never read it


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One visit: `tokens` sampled, the last committed iff `keep_last`, then on to `dst` (itself: `max_tokens`)."""

    tokens: int
    dst: int
    keep_last: bool


def check_router(router: Router, name: str) -> None:
    """ValueError for a router whose decisions need the model's outputs (they cannot be planned before a visit)."""
    if router.device is not None or router.needs_logits or router.needs_hidden:
        raise ValueError(f"router {name!r} reads the model's outputs; standard serving plans each visit before it "
                         "runs, which only a synthetic router allows (r2r, citer, co-llm, r-stitch, markov, me, "
                         "trace)")  # fmt: skip


def plan_run(router: Router, req: Request, model: int) -> RunPlan:
    """The next visit of `req` on `model`, consuming `router`'s draws as the routed scheduler would (one a token)."""
    left = req.sampling.max_tokens - req.num_output
    if left < 1:
        raise ValueError(f"{req.rid}: no token left to write (max_tokens {req.sampling.max_tokens})")
    probe = Request(req.rid, list(req.token_ids), req.prompt_len, req.sampling, num_models=router.num_models,
                    entry=req.entry, eos_token_ids=req.eos_token_ids)  # fmt: skip
    n = 0
    while True:
        row = BatchRow(probe, len(probe.token_ids) - 1, 1, True, probe.version)
        dst = int(next(iter(router.route(Batch(model, 0, [row]), StepResult([_PROBE])))))
        probe.token_ids.append(_PROBE)
        n += 1
        if dst != model:
            return RunPlan(n, dst, bool(router.keep_token(probe, dst)))
        if n == left:
            return RunPlan(n, model, True)
