"""Warm-up calibration of a `random` learned router on its own model runner, before serving: a short decode of
seeded random prompts at temperature 1 fixes its threshold; the pages it takes go back to the pool.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.base import ModelRunner
from tokenrouter.routers.learned.score_gate import ScoreGate


@runtime_checkable
class Calibratable(Protocol):
    """A router whose threshold is set from its own scores on warm-up steps before serving (`LearnedRouter`):
    `needs_calibration` stays True until `observe` has fed the bound gate `calibration_rows` rows (it returns True)."""

    model: int
    calibration_rows: int

    @property
    def needs_calibration(self) -> bool: ...

    @property
    def gate(self) -> ScoreGate | None: ...

    def observe(self, token_ids: Any, hidden: Any, logits: Any) -> bool: ...


def calibrate_on_runner(router: Calibratable, runner: ModelRunner, *, num_prompts: int = 16, prompt_len: int = 16,
                        max_steps: int = 256, seed: int = 0) -> float | None:  # fmt: skip
    """Run warm-up steps on `runner` until the bound router is calibrated; return the threshold it set
    (in score space), or None when the bound model's part needs no calibration."""
    gate = router.gate
    if not router.needs_calibration or gate is None:
        return None
    rng = random.Random(seed)
    vocab = runner.spec.vocab_size
    pool = runner.kv_pool
    n = max(1, min(num_prompts, runner.max_batch_size))
    reqs = [
        Request(
            f"_calibrate{i}",
            [rng.randrange(vocab) for _ in range(prompt_len)],
            prompt_len,
            SamplingParams(temperature=1.0, seed=seed + i, max_tokens=max_steps),
        )
        for i in range(n)
    ]
    batch = Batch(router.model, 0, [BatchRow(r, 0, prompt_len) for r in reqs])
    try:
        for step in range(max_steps):
            for row in batch.rows:
                if not pool.grow(row.req.pages, row.context_len):
                    raise RuntimeError("the KV pool is too small for the calibration warm-up; lower num_prompts")
            out = runner.step(batch, return_hidden=gate.needs_hidden, return_logits=gate.needs_logits).result()
            if router.observe(out.next_token_ids, out.hidden, out.logits):
                return float(gate.threshold.item())
            toks = out.next_token_ids.tolist() if hasattr(out.next_token_ids, "tolist") else list(out.next_token_ids)
            for r, t in zip(reqs, toks, strict=True):
                r.token_ids.append(int(t))
            if reqs[0].num_tokens >= runner.max_context_len:
                break
            batch = Batch(batch.model, step + 1, [BatchRow(r, r.num_tokens - 1, 1) for r in reqs])
    finally:
        for r in reqs:
            pool.release(r.pages)
    raise RuntimeError(f"calibration saw fewer than {router.calibration_rows} rows in {max_steps} warm-up steps")
