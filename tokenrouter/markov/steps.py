"""Step times of the Markov model: quantization onto a common time grid (d_i(b) = max(1, round(L_i(b) / delta)),
the exact gcd of all d_i(b) factored out: docs/markov.md), and the feasible thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

# Through the module, so each call finds the rule the core has then (one a test swaps in, too).
from tokenrouter.core import policy

StepSpec = float | Sequence[float] | Callable[[int], float]
"""Step time of one model in ms: a constant, L(b) for b = 1..N as a sequence (index b - 1), or a callable."""


@dataclass(slots=True, frozen=True)
class StepQuanta:
    """Quantized step times. `quanta[i, b]` = d_i(b) / g for b = 1..N (column 0 unused, 0); `table_ms[i, b - 1]`
    is the unrounded L_i(b) they came from (kept so the model can be requantized)."""

    quanta: np.ndarray
    delta_ms: float
    gcd: int
    max_step_error_ms: float
    table_ms: np.ndarray

    @property
    def delta_eff_ms(self) -> float:
        """Effective (exact) quantum after factoring out the gcd."""
        return self.delta_ms * self.gcd

    @property
    def max_quanta(self) -> int:
        """The longest step in effective quanta: state counts grow with it (residual times)."""
        return int(self.quanta.max())


def quantize_steps(step_ms: Sequence[StepSpec], concurrency: int, delta_ms: float = 0.1) -> StepQuanta:
    """Round every L_i(b), b = 1..N, to d_i(b) = max(1, round(L_i(b) / delta)) and factor out their gcd."""
    n = check_concurrency(concurrency)
    table = np.array([_step_table(spec, n, i) for i, spec in enumerate(step_ms)], dtype=float).reshape(-1, n)
    return quantize_table(table, delta_ms)


def quantize_table(table: np.ndarray, delta_ms: float) -> StepQuanta:
    """`quantize_steps` for a ready (M, N) table of step times in ms."""
    if not (math.isfinite(delta_ms) and delta_ms > 0):
        raise ValueError(f"delta must be a positive number of ms, got {delta_ms}")
    d = np.maximum(1, np.floor(table / delta_ms + 0.5)).astype(np.int64)
    g = int(np.gcd.reduce(d.ravel()))
    quanta = np.zeros((len(table), table.shape[1] + 1), dtype=np.int64)
    quanta[:, 1:] = d // g
    err = float(np.abs(d * delta_ms - table).max())
    # Float noise (27.9 / 0.1 = 278.99999999999994) is not a rounding error worth reporting.
    return StepQuanta(quanta, float(delta_ms), g, err if err > 1e-9 * float(table.max()) else 0.0, table)


def _step_table(spec: StepSpec, n: int, i: int) -> np.ndarray:
    if callable(spec):
        values = np.array([float(spec(b)) for b in range(1, n + 1)])
    elif np.ndim(spec) == 0:
        values = np.full(n, float(spec))  # type: ignore[arg-type]
    else:
        values = np.asarray(spec, dtype=float).ravel()
        if len(values) < n:
            raise ValueError(f"step times of model {i} give {len(values)} batch sizes, need {n} (b = 1..N)")
        values = values[:n]
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"step times of model {i} must be positive and finite")
    return values


def check_concurrency(concurrency: int) -> int:
    if isinstance(concurrency, bool) or int(concurrency) != concurrency or concurrency < 1:
        raise ValueError(f"concurrency must be a positive integer, got {concurrency}")
    return int(concurrency)


def feasible_thresholds(num_models: int, concurrency: int) -> list[tuple[int, ...]]:
    """All B in {1..N}^M that the core's deadlock guard (`core.policy.guard_holds`) admits at N, in lexicographic
    order: the guard is the core's, so a rule changed there changes the candidates here."""
    n = check_concurrency(concurrency)

    def rec(prefix: tuple[int, ...], left: int) -> Iterator[tuple[int, ...]]:
        if left == 0:
            yield prefix
            return
        for x in range(1, n + 1):
            # Raising one B_i never makes the guard easier, so once the prefix with every later B_j = 1 fails,
            # every larger x fails too: stop there instead of listing all N^M vectors.
            if not policy.guard_holds((*prefix, x, *(1,) * (left - 1)), n):
                break
            yield from rec((*prefix, x), left - 1)

    return list(rec((), num_models))


def live_thresholds(thresholds: Sequence[int], live: int) -> tuple[int, ...]:
    """The B a scheduler applies while only `live` requests are in the system: the core's clamp itself, so the model
    sees what the schedulers do between a request's finish and its replacement's admission."""
    return policy.clamp_thresholds(thresholds, live)
