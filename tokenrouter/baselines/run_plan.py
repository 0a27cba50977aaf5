"""How many tokens a model writes before the request leaves it: the std-serving dispatcher's use of a router.

A standard server cannot stop a request in mid-generation, so the dispatcher asks the router the routed
scheduler's questions (`route`, `keep_token`) before it sends a visit, one per token, until the router names
another model or `max_tokens` is reached. For the synthetic routers this is the same decision sequence the routed
scheduler draws; routers that read the step's outputs cannot be planned ahead: `check_router` refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.core.batch import Batch, BatchRow, StepResult
from tokenrouter.core.request import Request
from tokenrouter.core.router import Router

_PROBE = 0  # stands for a token not sampled yet: synthetic routers never read it


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One visit: the model samples `tokens` tokens; the last one is committed iff `keep_last`; then the request
    goes to `dst` (`dst == model`: it reached `max_tokens` here, and every token is kept)."""

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
    """Ask `router` (bound to `model`) for the decisions of the tokens `model` samples next for `req` (whose
    `token_ids` are the prompt and the committed output); consumes the router's random draws as the routed
    scheduler would, one per sampled token."""
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
