"""Routing presets (P, C) for the Markov model: which model a request visits next and what it commits.

P[i, j]: probability that a request leaving a step on model i goes to model j (j = i: it stays);
C[i, j]: tokens committed on that route. Model 0 is the entry (small) model.
"""

from __future__ import annotations

import numpy as np

from tokenrouter.core.names import RouterName


def r2r_preset(hop_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) for R2R-like routing: model 0 small, model 1 large.

    After a small-model step the request hops with probability p; the small token is then dropped
    (c_01 = 0), the large model regenerates it and hands back after one token, committed on return
    (p_10 = 1, c_10 = 1). Without a hop the small token is committed (c_00 = 1).
    """
    p = _probability(hop_prob, "hop probability")
    return np.array([[1 - p, p], [1.0, 0.0]]), np.array([[1.0, 0.0], [1.0, 0.0]])


def rstitch_preset(hop_prob: float, return_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) for R-Stitch-like routing: a geometric run on the large model.

    Small model 0 hops with probability p and its token is dropped (c_01 = 0). The large model commits every
    token it writes (c_10 = c_11 = 1) and hands back after each step with probability q, so its run length
    is Geometric(q) with mean 1/q. q = 1 is R2R.
    """
    p = _probability(hop_prob, "hop probability")
    q = _probability(return_prob, "return probability")
    return np.array([[1 - p, p], [q, 1 - q]]), np.array([[1.0, 0.0], [1.0, 1.0]])


def me_preset(num_models: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) for the ME ensemble: every token visits models 0, 1, .., M-1 in turn, and only the last model
    commits it (it combines the ensemble's logits), then hands the request back to model 0. Routing is
    deterministic, so without completions (`mean_output`) the chain is the lockstep orbit.
    """
    if num_models < 2:
        raise ValueError(f"an ensemble needs at least 2 models, got {num_models}")
    m = num_models
    p = np.zeros((m, m))
    p[np.arange(m), (np.arange(m) + 1) % m] = 1.0
    c = np.zeros((m, m))
    c[m - 1, 0] = 1.0
    return p, c


def _probability(x: float, name: str) -> float:
    x = float(x)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {x}")
    return x


def router_matrices(
    name: str,
    num_models: int = 2,
    *,
    hop_rate: float = 0.1,
    return_prob: float = 1.0,
    mean_small_run: float | None = None,
    mean_large_run: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) for a router preset of `tokenrouter.routers` by name: the geometric ones (r2r, citer, co-llm,
    hop-rate, r-stitch, markov) over two models, `me` over `num_models`. ValueError for anything else (a trace
    router has no stationary hop law)."""
    key = name.lower()
    if key == RouterName.ME:
        return me_preset(num_models)
    if num_models != 2:
        raise ValueError(f"router {name!r} routes between two models (small, large), not {num_models}")
    if key in (RouterName.R2R, RouterName.CITER, RouterName.CO_LLM, "hop-rate"):
        return r2r_preset(hop_rate)
    if key == RouterName.R_STITCH:
        return rstitch_preset(hop_rate, return_prob)
    if key == RouterName.MARKOV and mean_small_run and mean_large_run and min(mean_small_run, mean_large_run) >= 1:
        return rstitch_preset(1.0 / mean_small_run, 1.0 / mean_large_run)
    raise ValueError(
        f"the Markov model needs a geometric router (r2r, citer, co-llm, r-stitch, markov with mean run "
        f"lengths >= 1) or me, not {name!r}: pass --thresholds"
    )
