"""Reachable-state search for the Markov throughput model on plain integer arrays: the pre-completion chain of
docs/markov.md ("A smaller chain"). All thresholds of a search are explored in one level-synchronous BFS (the
threshold index is part of the state key), so numpy's per-call overhead is paid once per level, not per B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenrouter.markov.steps import live_thresholds

# States beyond this many in one exploration most likely mean the quantum is far too fine for the horizon.
DEFAULT_MAX_STATES = 2_000_000
_INT_KEY_LIMIT = 2.0**62  # states pack into one int64 key while the mixed radix stays below this


class StateSpaceTooLarge(ValueError):
    """The reachable chain has more states than allowed (raised while exploring). A ValueError, so a command
    line prints one line; `tokenrouter.markov.search` catches it and falls back to a smaller search."""

    def __init__(self, max_states: int, num_models: int, concurrency: int) -> None:
        super().__init__(
            f"the Markov chain of {num_models} models at N={concurrency} exceeds {max_states:,} states; "
            "use a coarser quantum (--delta-ms), a smaller N or a larger --max-states"
        )
        self.max_states = max_states


@dataclass(slots=True)
class ExploredChains:
    """Reachable pre-completion states and transitions for a list of threshold vectors (vector g's states are
    `offsets[g]:offsets[g+1]`). Every state has a completing model (running, residual 0); `src` rows' probabilities
    sum to 1 per state (duplicate (src, dst) edges must be summed). Rewards are expectations over the next
    transition, in quanta and requests (`done`: batches completed, `done_size`: requests in them)."""

    k: np.ndarray  # (n, M) waiting requests
    b: np.ndarray  # (n, M) running batch size (0 = idle)
    r: np.ndarray  # (n, M) residual in quanta, relative to this completion instant
    offsets: np.ndarray  # (G+1,) state blocks per threshold vector
    start: np.ndarray  # (G,) global id of the first embedded state of each block
    src: np.ndarray  # (E,) transition sources (global ids)
    dst: np.ndarray  # (E,)
    prob: np.ndarray  # (E,)
    tokens: np.ndarray  # (n,)
    tau: np.ndarray  # (n,)
    done: np.ndarray  # (n, M)
    done_size: np.ndarray  # (n, M)
    busy: np.ndarray  # (n, M)
    queue: np.ndarray  # (n, M)
    running: np.ndarray  # (n, M)


def multinomial_outcomes(routing: np.ndarray, n_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tables of Multinomial(b; p_i.) outcomes for every model i and batch size b = 0..n_max; `routing` is (M, D),
    D >= M (see `explore`). Returns flat `counts` (E, D) and `probs` (E,) and, per (i, b), the first row
    `start[i, b]` and number `count[i, b]` of its outcomes. Only destinations with p_ij > 0 appear, so
    zero-probability outcomes create no states. Row 0 is the null outcome, for models that are not completing."""
    m, d = routing.shape
    _log_factorial = np.array([math.lgamma(k + 1) for k in range(n_max + 1)])  # log k!, k = 0..n_max
    counts: list[np.ndarray] = [np.zeros((1, d), dtype=np.int64)]
    probs: list[np.ndarray] = [np.ones(1)]
    start = np.zeros((m, n_max + 1), dtype=np.int64)
    count = np.zeros((m, n_max + 1), dtype=np.int64)
    row = 1
    for i in range(m):
        support = np.flatnonzero(routing[i] > 0)
        logp = np.log(routing[i, support])
        for b in range(n_max + 1):
            comp = _compositions(b, len(support))
            full = np.zeros((len(comp), d), dtype=np.int64)
            full[:, support] = comp
            logpmf = _log_factorial[b] - _log_factorial[comp].sum(axis=1) + (comp * logp).sum(axis=1)
            counts.append(full)
            probs.append(np.exp(logpmf))
            start[i, b], count[i, b] = row, len(comp)
            row += len(comp)
    return np.concatenate(counts), np.concatenate(probs), start, count


def _compositions(total: int, parts: int) -> np.ndarray:
    """All nonnegative integer vectors of length `parts` summing to `total`, one per row."""
    if parts == 1:
        return np.array([[total]], dtype=np.int64)
    rows = [
        np.column_stack([np.full(len(sub), first), sub])
        for first in range(total, -1, -1)
        for sub in [_compositions(total - first, parts - 1)]
    ]
    return np.concatenate(rows)


class _KeyIndex:
    """Maps state rows (threshold index, k[M], b[M], r[M]) to dense ids, in discovery order: packed into one int64
    when the mixed radix fits, else hashed as tuples (slower, any size)."""

    def __init__(self, m: int, n: int, d_max: int, n_groups: int) -> None:
        radix = [n_groups] + [n + 1] * (2 * m) + [d_max + 1] * m
        self.weights: np.ndarray | None = None
        if float(np.prod(np.array(radix, dtype=float))) < _INT_KEY_LIMIT:
            w = np.cumprod([1, *radix[:0:-1]])[::-1]  # weight of each column, last column fastest
            self.weights = np.asarray(w, dtype=np.int64)
        self.ids: dict = {}

    def lookup_or_add(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ids for `rows` (new states get the next ids); returns (ids, row indices of the new states)."""
        if self.weights is None:
            pos: dict = {}
            first_l: list[int] = []
            inverse = np.empty(len(rows), dtype=np.int64)
            for j, key in enumerate(map(tuple, rows.tolist())):
                u = pos.get(key)
                if u is None:
                    u = pos[key] = len(pos)
                    first_l.append(j)
                inverse[j] = u
            uniq, first = list(pos), np.array(first_l, dtype=np.int64)
        else:
            # Dedupe in C first: a BFS level reaches the same child from many parents.
            uniq_arr, first, inverse = np.unique(rows @ self.weights, return_index=True, return_inverse=True)
            uniq = uniq_arr.tolist()
        table = self.ids
        got = np.array([table.get(key, -1) for key in uniq], dtype=np.int64)
        fresh = np.flatnonzero(got < 0)
        got[fresh] = np.arange(len(table), len(table) + len(fresh))
        table.update(zip([uniq[j] for j in fresh.tolist()], got[fresh].tolist(), strict=True))
        return got[inverse], first[fresh]


def explore(quanta: np.ndarray, routing: np.ndarray, commit_mean: np.ndarray, concurrency: int, thresholds: np.ndarray,
            max_states: int = DEFAULT_MAX_STATES, finish: np.ndarray | None = None,
            entry: int = 0) -> ExploredChains:  # fmt: skip
    """BFS over reachable pre-completion states, for every row of feasible `thresholds` (G, M) at once.
    `quanta[i, b]`: model i's step in quanta at batch size b; `commit_mean[i]` = sum_j c_ij p_ij. `finish[i, j]`
    (optional): probability that a request routed i -> j has just committed its last token; its replacement
    arrives at `entry` *after* this instant's launches (`_destinations`), which breaks lockstep."""
    m, n = routing.shape[0], concurrency
    thr = np.asarray(thresholds, dtype=np.int64).reshape(-1, m)
    n_groups = len(thr)
    # thr_live[g, L]: what the schedulers apply while L finished requests await their replacements (live N - L).
    thr_live = np.array([[live_thresholds(b, n - late) for late in range(n + 1)] for b in thr.tolist()])
    outcomes = multinomial_outcomes(_destinations(routing, finish, entry), n)
    index = _KeyIndex(m, n, int(quanta.max()), n_groups)
    start, rows = _start_states(index, m, n, thr, quanta, thr_live)
    # Invariant: the frontier holds the newest states, ids len(index.ids) - len(front) .. len(index.ids) - 1.
    all_rows = [rows]
    src_l: list[np.ndarray] = []
    dst_l: list[np.ndarray] = []
    prob_l: list[np.ndarray] = []
    rew_l: list[np.ndarray] = []
    front = rows
    while len(front):
        lo = len(index.ids) - len(front)
        g, k, b, r = front[:, 0], front[:, 1 : 1 + m], front[:, 1 + m : 1 + 2 * m], front[:, 1 + 2 * m :]
        completing = (b > 0) & (r == 0)
        parent, arrivals, prob = _route_completions(completing, b, outcomes)
        ck, cb, cr, ctau, cg = _launch_and_advance(k[parent] + arrivals[:, :m], np.where(completing, 0, b)[parent],
                                                   r[parent], g[parent], thr, quanta, thr_live, late=arrivals[:, m],
                                                   entry=entry)  # fmt: skip
        child_rows = np.column_stack([cg, ck, cb, cr])
        if len(child_rows) > 8 * max_states + 100_000:  # one level would cost more than the cap is meant to allow
            raise StateSpaceTooLarge(max_states, m, n)
        ids, new = index.lookup_or_add(child_rows)
        if len(index.ids) > max_states:
            raise StateSpaceTooLarge(max_states, m, n)
        done_size = np.where(completing, b, 0)
        rew_l.append(_rewards(parent, prob * ctau, ck, cb, completing, done_size, commit_mean))
        src_l.append(lo + parent)
        dst_l.append(ids)
        prob_l.append(prob)
        front = child_rows[new]
        all_rows.append(front)
    transitions = (np.concatenate(src_l), np.concatenate(dst_l), np.concatenate(prob_l))
    return _renumbered(np.concatenate(all_rows), np.concatenate(rew_l), transitions, start, quanta, n_groups)


def _destinations(routing: np.ndarray, finish: np.ndarray | None, entry: int) -> np.ndarray:
    """(M, M + 1) where a completing request goes: model j, or column M, "finished: replaced by a late arrival at the
    entry". A request finishing on the entry is no late arrival (its successor queues before the entry launches)."""
    m = routing.shape[0]
    h = np.zeros((m, m)) if finish is None else np.asarray(finish, dtype=float)
    replaced = (routing * h).sum(axis=1)
    dest = np.column_stack([routing * (1.0 - h), replaced])
    dest[entry, entry] += replaced[entry]
    dest[entry, m] = 0.0
    return dest


def _start_states(index: _KeyIndex, m: int, n: int, thr: np.ndarray, quanta: np.ndarray,
                  thr_live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per threshold vector its first embedded state's id, and the distinct start rows (g, k, b, r): all N waiting
    at model 0, advanced by the launch rule to the first completion (a transient interval: its tau is dropped)."""
    n_groups = len(thr)
    k0 = np.zeros((n_groups, m), dtype=np.int64)
    k0[:, 0] = n
    g0 = np.arange(n_groups)
    zeros = np.zeros_like(k0)
    k, b, r, _, g = _launch_and_advance(k0, zeros, zeros, g0, thr, quanta, thr_live)
    rows = np.column_stack([g, k, b, r])
    start, first = index.lookup_or_add(rows)
    return start, rows[first]


def _route_completions(completing: np.ndarray, b: np.ndarray,
                       outcomes: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Route every completing batch of the frontier (the product of its completing models' outcome sets). Per child:
    its parent's frontier row, the arrivals per destination (M + 1 columns, the last late) and its probability."""
    out_counts, out_probs, out_start, out_count = outcomes
    n_front, m = completing.shape
    parent = np.arange(n_front)
    arrivals = np.zeros((n_front, m + 1), dtype=np.int64)
    prob = np.ones(n_front)
    for i in range(m):
        ci = completing[parent, i]
        if not ci.any():
            continue
        reps = np.where(ci, out_count[i, b[parent, i]], 1)
        first_out = np.where(ci, out_start[i, b[parent, i]], 0)
        expand = np.repeat(np.arange(len(parent)), reps)
        local = np.arange(len(expand)) - np.repeat(np.cumsum(reps) - reps, reps)  # rank inside its group
        outcome = np.where(ci[expand], first_out[expand] + local, 0)
        parent = parent[expand]
        arrivals = arrivals[expand] + out_counts[outcome]
        prob = prob[expand] * out_probs[outcome]
    return parent, arrivals, prob


def _rewards(parent: np.ndarray, w: np.ndarray, ck: np.ndarray, cb: np.ndarray, completing: np.ndarray,
             done_size: np.ndarray, commit_mean: np.ndarray) -> np.ndarray:  # fmt: skip
    """Per-source expected rewards of one BFS level: tokens, tau, busy[M], queue[M], running[M], done[M],
    done_size[M]. `w`: each child's probability x holding time, over which the post-launch (ck, cb) is constant."""
    nf, m = completing.shape
    cols = [np.bincount(parent, weights=w, minlength=nf)]
    for arr in (cb > 0, ck, cb):
        cols.extend(np.bincount(parent, weights=w * arr[:, i], minlength=nf) for i in range(m))
    tokens = (done_size * commit_mean).sum(axis=1)
    return np.column_stack([tokens, *cols, completing.astype(float), done_size.astype(float)])


def _renumbered(states: np.ndarray, rew: np.ndarray, transitions: tuple[np.ndarray, np.ndarray, np.ndarray],
                start: np.ndarray, quanta: np.ndarray, n_groups: int) -> ExploredChains:  # fmt: skip
    """The explored chains renumbered: each threshold vector's states contiguous, inside a block by increasing
    total residual (then the slowest model's, ...), so (I - T) is near triangular and sparse LU has little fill-in."""
    src, dst, prob = transitions
    m = (states.shape[1] - 1) // 3  # a state row is (g, k[M], b[M], r[M])
    slow_first = np.argsort(-quanta.max(axis=1), kind="stable")
    keys = [states[:, 1 : 1 + 2 * m][:, ::-1].T, states[:, 1 + 2 * m :][:, slow_first[::-1]].T]
    order = np.lexsort(np.vstack([*keys, states[:, 1 + 2 * m :].sum(axis=1), states[:, 0]]))
    new_id = np.empty_like(order)
    new_id[order] = np.arange(len(order))
    states, rew = states[order], rew[order]
    offsets = np.searchsorted(states[:, 0], np.arange(n_groups + 1))
    # Reward columns, as `_rewards` lays them out: tokens, tau, busy[M], queue[M], running[M], done[M], done_size[M].
    names = ("busy", "queue", "running", "done", "done_size")
    per_model = {name: rew[:, 2 + j * m : 2 + (j + 1) * m] for j, name in enumerate(names)}
    return ExploredChains(k=states[:, 1 : 1 + m], b=states[:, 1 + m : 1 + 2 * m], r=states[:, 1 + 2 * m :],
                          offsets=offsets, start=new_id[start], src=new_id[src], dst=new_id[dst], prob=prob,
                          tokens=rew[:, 0], tau=rew[:, 1], **per_model)  # fmt: skip


def _launch_and_advance(k: np.ndarray, b: np.ndarray, r: np.ndarray, g: np.ndarray, thr: np.ndarray, quanta: np.ndarray,
                        thr_live: np.ndarray, late: np.ndarray | None = None,
                        entry: int = 0) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Launch rule, then advance to the next completion: idle models with k_i >= B_i (B for N minus the `late`
    replacements still to come) take all k_i waiting; the `late` requests join the entry's queue and the rule runs
    again with B for N; then every running residual drops by tau = the smallest. Returns (k, b, r, tau, g)."""
    if late is None or not late.any():
        k, b, r = _launch(k, b, r, thr[g], quanta)
    else:
        k, b, r = _launch(k, b, r, thr_live[g, late], quanta)
        k = k.copy()
        k[:, entry] += late
        k, b, r = _launch(k, b, r, thr[g], quanta)
    running = b > 0
    big = np.iinfo(np.int64).max
    tau = np.where(running, r, big).min(axis=1)
    if (tau == big).any() or (tau <= 0).any():  # feasibility guard violated or corrupt residuals
        raise AssertionError("no running model after the launch rule: thresholds are not feasible")
    r = np.where(running, r - tau[:, None], 0)
    return k, b, r, tau, g


def _launch(k: np.ndarray, b: np.ndarray, r: np.ndarray, thr: np.ndarray,
            quanta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    launch = (b == 0) & (k >= thr) & (k > 0)
    b = np.where(launch, k, b)
    r = np.where(launch, quanta[np.arange(k.shape[1]), k], r)
    k = np.where(launch, 0, k)
    return k, b, r
