"""Stationary solve for the Markov throughput model: closed classes and their stationary distributions."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse.csgraph import connected_components

_DENSE_LIMIT = 400  # below this many states a dense solve beats SuperLU's setup cost


def class_distributions(t: sp.csr_matrix, start: int) -> list[tuple[float, np.ndarray]]:
    """Stationary distribution of each closed class reachable from `start`, with its absorption probability (usually
    one class, weight 1); transient states get probability 0."""
    n = t.shape[0]
    n_comp, lab = connected_components(t, directed=True, connection="strong")
    if n_comp == 1:
        return [(1.0, stationary_distribution(t, natural_order=True))]
    coo = t.tocoo()
    has_exit = np.zeros(n_comp, dtype=bool)
    has_exit[lab[coo.row[lab[coo.row] != lab[coo.col]]]] = True
    closed = np.flatnonzero(~has_exit)
    transient = np.isin(lab, closed, invert=True)
    if len(closed) == 1:
        absorb = np.ones(1)
    elif not transient[start]:
        absorb = (closed == lab[start]).astype(float)
    else:
        # Expected visits y to transient states from start: (I - Q)^T y = e_start; then the mass y T flowing
        # out of transient states, summed per closed class.
        tr = np.flatnonzero(transient)
        e = np.zeros(len(tr))
        e[np.searchsorted(tr, start)] = 1.0
        y = spla.spsolve((sp.identity(len(tr), format="csc") - t[tr][:, tr]).T.tocsc(), e)
        flow = t[tr].T @ y
        absorb = np.array([flow[lab == c].sum() for c in closed])
    out = []
    for c, a in zip(closed, absorb, strict=True):
        if a <= 0:
            continue
        idx = np.flatnonzero(lab == c)
        pi = np.zeros(n)
        pi[idx] = stationary_distribution(t[idx][:, idx], natural_order=True)
        out.append((float(a / absorb.sum()), pi))
    return out


def stationary_distribution(t: sp.spmatrix, natural_order: bool = False) -> np.ndarray:
    """pi with pi T = pi, sum 1, for an irreducible stochastic matrix (periodic chains are fine). Fixes pi_ref = 1 for
    a likely state and solves the other equations of (I - T)^T pi = 0 (sparse, a nonsingular M-matrix: LU without
    pivoting; `natural_order` keeps the given state order, as `explore` numbers them). Falls back to power
    iteration on the lazy chain (I + T) / 2 if the direct solution is not accurate."""
    n = t.shape[0]
    if n == 1:
        return np.ones(1)
    t = sp.csr_matrix(t)
    tt = t.T.tocsr()
    guess = np.full(n, 1.0 / n)
    for _ in range(8):
        guess = 0.5 * (guess + tt @ guess)
    ref = int(np.argmax(guess))
    keep = np.flatnonzero(np.arange(n) != ref)
    a = (sp.identity(n, format="csr") - tt)[keep][:, keep]
    rhs = tt[keep, ref].toarray().ravel()
    try:
        if n <= _DENSE_LIMIT:
            x = np.linalg.solve(a.toarray(), rhs)
        else:
            perm = "NATURAL" if natural_order else "MMD_AT_PLUS_A"
            lu = spla.splu(a.tocsc(), permc_spec=perm, diag_pivot_thresh=0.0, options={"SymmetricMode": True})
            x = lu.solve(rhs)
        pi = np.empty(n)
        pi[keep], pi[ref] = x, 1.0
    except (np.linalg.LinAlgError, RuntimeError):
        pi = np.full(n, np.nan)
    if np.isfinite(pi).all() and pi.min() >= -1e-9 * pi.max():
        pi = np.clip(pi, 0.0, None)
        pi /= pi.sum()
        if np.abs(tt @ pi - pi).sum() < 1e-9:
            return pi
    return _power_iteration(t)


def _power_iteration(t: sp.csr_matrix, tol: float = 1e-13, max_iter: int = 200_000) -> np.ndarray:
    tt = t.T.tocsr()
    pi = np.full(t.shape[0], 1.0 / t.shape[0])
    for _ in range(max_iter):
        nxt = 0.5 * (pi + tt @ pi)
        if np.abs(nxt - pi).sum() < tol:
            return nxt / nxt.sum()
        pi = nxt
    raise RuntimeError("stationary distribution did not converge")
