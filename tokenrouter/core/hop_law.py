"""Hop laws: each router's transition law, the one source for the synthetic routers and the Markov model.

A law is (P, C) over the models, model 0 the entry (small) one: P[i][j] the probability that a request leaving a
step on model i goes to j (j = i: it stays), C[i][j] whether the token sampled on that route is committed (False:
the destination regenerates it). Each router's law: docs/markov.md, "Routers as (P, C)"; a trace router has none.
Pure Python, so the core's config can check names and rates."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from tokenrouter.core.names import RouterName

ONE_TOKEN_HANDBACK = frozenset({RouterName.R2R, RouterName.CITER, RouterName.CO_LLM})
SYNTHETIC_HOP_RATE = ONE_TOKEN_HANDBACK | {RouterName.R_STITCH}
"""Routers whose synthetic hops are a draw of the hop rate, which a running deployment may change."""
MARKOV_ROUTERS = SYNTHETIC_HOP_RATE | {RouterName.MARKOV, RouterName.ME}
"""Routers with a stationary hop law, which the Markov model describes (and autotune therefore tunes)."""


def check_prob(x: object, what: str, error: type[ValueError] = ValueError) -> float:
    """`x` as a float if it is a probability (a real number in [0, 1], not a bool), else a one-line `error`
    naming `what`."""
    if isinstance(x, bool) or not isinstance(x, Real) or not 0.0 <= x <= 1.0:
        raise error(f"{what} must be in [0, 1], got {x if isinstance(x, Real) else repr(x)}")
    return float(x)


@dataclass(frozen=True, slots=True)
class HopLaw:
    """(P, C) of a router (module docstring). Rows of P sum to 1; both are square over the models."""

    routing: tuple[tuple[float, ...], ...]
    commit: tuple[tuple[bool, ...], ...]

    @property
    def drops_token(self) -> tuple[bool, ...]:
        """Per model: does its hand-off drop the token it sampled (C is False off the diagonal)?"""
        m = len(self.commit)
        return tuple(not any(self.commit[i][j] for j in range(m) if j != i) for i in range(m))


def geometric_run(hop_rate: float, return_prob: float = 1.0) -> HopLaw:
    """Two models: the small one hops w.p. `hop_rate` per step and its token is dropped; the large one commits what
    it writes and hands back w.p. `return_prob` per token (1: after one token, as R2R)."""
    p, q = check_prob(hop_rate, "hop rate"), check_prob(return_prob, "return probability")
    return HopLaw(((1.0 - p, p), (q, 1.0 - q)), ((True, False), (True, True)))


def ensemble(num_models: int) -> HopLaw:
    """ME: every token visits models 0, 1, .., M-1 in turn; the last commits it and hands the request back to 0."""
    if num_models < 2:
        raise ValueError(f"an ensemble needs at least 2 models, got {num_models}")
    m = num_models
    routing = tuple(tuple(1.0 if j == (i + 1) % m else 0.0 for j in range(m)) for i in range(m))
    commit = tuple(tuple(i == m - 1 and j == 0 for j in range(m)) for i in range(m))
    return HopLaw(routing, commit)


def hop_law(name: str, num_models: int = 2, *, hop_rate: float = 0.1, return_prob: float = 1.0,
            mean_small_run: float | None = None, mean_large_run: float | None = None) -> HopLaw:  # fmt: skip
    """The law of router `name` over `num_models` models (`return_prob` counts for r-stitch only, the mean runs for
    markov only). ValueError for a router without a law or for a two-model router over another number of models."""
    key = str(name).lower()
    if key == RouterName.ME:
        return ensemble(num_models)
    if key not in MARKOV_ROUTERS:  # the value, not the enum's repr
        raise ValueError(f"router '{key}' has no hop law: choose one of {', '.join(sorted(MARKOV_ROUTERS))}")
    if num_models != 2:
        raise ValueError(f"router '{key}' routes between two models (small, large), not {num_models}")
    if key != RouterName.MARKOV:
        return geometric_run(hop_rate, return_prob if key == RouterName.R_STITCH else 1.0)
    if not mean_small_run or not mean_large_run or mean_small_run < 1 or mean_large_run < 1:
        raise ValueError("markov router needs mean run lengths >= 1 on both models")
    return geometric_run(1.0 / mean_small_run, 1.0 / mean_large_run)
