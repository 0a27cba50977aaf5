"""Test doubles that behave like the runtime's parts where bugs hide: an executor whose token depends on what
it was fed (a `from_prev` row's token included), and the token reference that checks it independently."""

from __future__ import annotations

from collections.abc import Sequence

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.request import Request
from tokenrouter.core.router import Router


def token_of(model: int, pos: int, last_fed: int) -> int:
    """The token `model` samples at sequence position `pos` after being fed `last_fed` at `pos - 1`."""
    return (7919 * (model + 1) + 104_729 * pos + 31 * last_fed) % 100_003 + 1


class FakeExecutor:
    """Runs batches of one model in launch order, as the device stream does. A `from_prev` row feeds the token
    the previous step sampled for its request (kept here, never read from the host), like the engine."""

    def __init__(self, model: int) -> None:
        self.model = model
        self._prev: dict[int, int] = {}

    def run(self, batch: Batch) -> StepResult:
        assert batch.model == self.model
        toks, prev = [], {}
        for row in batch.rows:
            if row.from_prev:
                assert row.num_tokens == 1
                fed = self._prev[id(row.req)]  # KeyError: from_prev row without a sampled row the step before
            else:
                fed = row.req.token_ids[row.start + row.num_tokens - 1]
            tok = token_of(self.model, row.start + row.num_tokens, fed)
            toks.append(tok)
            if row.sample:
                prev[id(row.req)] = tok
        self._prev = prev
        return StepResult(toks)


def check_output(prompt: Sequence[int], emitted: Sequence[tuple[int, int, int]]) -> None:
    """Every output token is what its writer samples after the committed sequence before it."""
    seq = list(prompt)
    for pos, tok, model in sorted(emitted):
        assert pos == len(seq) - len(prompt), f"gap or duplicate at output position {pos}"
        assert tok == token_of(model, len(seq), seq[-1]), f"output {pos}: model {model} was fed a wrong token"
        seq.append(tok)


class ScriptedRouter(Router):
    """Routes by a per-(model, rid) script of destinations; stays when the script runs out."""

    def __init__(self, script: dict[tuple[int, str], list[int]] | None = None, keep_from: Sequence[int] = (1,)) -> None:
        super().__init__()
        self.script = script if script is not None else {}
        self.keep_from = set(keep_from)

    def route(self, batch: Batch, result: StepResult) -> list[int]:
        out = []
        for row in batch.rows:
            q = self.script.get((self.model, row.req.rid), [])
            out.append(q.pop(0) if q else self.model)
        return out

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.model in self.keep_from
