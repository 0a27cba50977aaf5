"""What the cost model needs to know about one step: its graph part, its eager part, and re-matched rows.
`StepStats` is the one argument of every step-time function (`ModelStepCost.step_ms`), built from a core `Batch`
split by the core's `GraphRule` (as the engine runs it) or from identical synthetic rows (`trsim tune`'s L_i(b)).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.graph_rule import GraphRule

# Rows longer than this are "long" rows of a varlen pass (the engine's `varlen_shapes.DEFAULT_SHORT_Q`; a varlen
# graph holds at most `DEFAULT_LONG_ROWS` of them, so a measured profile prices more as an eager pass).
SHORT_ROW_TOKENS = 16


@dataclass(frozen=True, slots=True)
class PartStats:
    """Rows of one forward pass: how many, tokens fed, tokens fed by extend/prefill rows, context attended, and
    rows of more than `SHORT_ROW_TOKENS` tokens."""

    rows: int = 0
    tokens: int = 0
    extend_tokens: int = 0
    context_tokens: int = 0
    long_rows: int = 0

    @classmethod
    def of_rows(cls, rows: Sequence[BatchRow]) -> PartStats:
        tok = ext = ctx = long = 0
        for r in rows:
            k = r.num_tokens
            tok += k
            ctx += r.start + k
            if k > 1:
                ext += k
                long += k > SHORT_ROW_TOKENS
        return cls(len(rows), tok, ext, ctx, long)


EMPTY = PartStats()


@dataclass(frozen=True, slots=True)
class StepStats:
    """One step: the CUDA-graph part and the eager part (each one pass), plus standard-serving bookkeeping:
    `rematch_rows` rows that arrived as new requests and re-matched a prefix of `rematch_prefix_tokens` in all.
    `graphs`: the model runs CUDA graphs at all (else its eager part runs without a varlen graph too)."""

    graph: PartStats = EMPTY
    eager: PartStats = EMPTY
    rematch_rows: int = 0
    rematch_prefix_tokens: int = 0
    graphs: bool = True

    @property
    def rows(self) -> int:
        return self.graph.rows + self.eager.rows

    @classmethod
    def of_batch(cls, batch: Batch, rule: GraphRule, rematch: Collection[int] = ()) -> StepStats:
        """Split `batch` as the engine runs it (`Batch.split`); `rematch` holds indices of re-matched rows."""
        graph, eager = batch.split(rule)
        rows = batch.rows
        return cls(PartStats.of_rows([rows[i] for i in graph]), PartStats.of_rows([rows[i] for i in eager]),
                   len(rematch), sum(rows[i].start for i in rematch), rule.enabled)  # fmt: skip

    @classmethod
    def uniform(cls, rows: int, tokens_per_row: int, context_per_row: int, rule: GraphRule) -> StepStats:
        """`rows` identical rows of `tokens_per_row` tokens each, attending `context_per_row` tokens each."""
        graph, eager = rule.split([tokens_per_row] * rows)
        ext = tokens_per_row if tokens_per_row > 1 else 0
        long = int(tokens_per_row > SHORT_ROW_TOKENS)

        def part(n: int) -> PartStats:
            return PartStats(n, n * tokens_per_row, n * ext, n * context_per_row, n * long) if n else EMPTY

        return cls(part(len(graph)), part(len(eager)), graphs=rule.enabled)

    @classmethod
    def one_pass(cls, rows: int, tokens: int, extend_tokens: int = 0, context_tokens: int = 0, *, graph: bool,
                 long_rows: int = 0, graphs: bool = True) -> StepStats:  # fmt: skip
        """A step that runs as a single pass: in a decode graph (`graph`), or as the varlen pass."""
        p = PartStats(rows, tokens, extend_tokens, context_tokens, long_rows)
        return cls(graph=p, graphs=graphs) if graph else cls(eager=p, graphs=graphs)
