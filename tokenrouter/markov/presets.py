"""Routing presets (P, C) for the Markov model as arrays, from the routers' hop laws (`tokenrouter.core.hop_law`):
P[i, j] the probability of route i -> j, C[i, j] the tokens committed on it; model 0 is the entry (small) model.
"""

from __future__ import annotations

import numpy as np

from tokenrouter.core import hop_law as law


def matrices(hl: law.HopLaw) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) of a hop law as float arrays."""
    return np.array(hl.routing, dtype=float), np.array(hl.commit, dtype=float)


def r2r_preset(hop_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """R2R (also CITER, Co-LLM): the small model hops w.p. p and its token is dropped; the large model writes that
    token (committed) and hands back after it."""
    return matrices(law.geometric_run(hop_prob))


def rstitch_preset(hop_prob: float, return_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """R-Stitch: as R2R, but the large model hands back w.p. q after each token it writes (a run of mean 1/q)."""
    return matrices(law.geometric_run(hop_prob, return_prob))


def me_preset(num_models: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The ME ensemble: deterministic routing 0 -> 1 -> .. -> M-1 -> 0, so without completions (`mean_output`)
    the chain is the lockstep orbit."""
    return matrices(law.ensemble(num_models))


def router_matrices(name: str, num_models: int = 2, **params: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(P, C) of router `name` (`tokenrouter.core.hop_law.hop_law`, which takes the same parameters)."""
    return matrices(law.hop_law(name, num_models, **params))
