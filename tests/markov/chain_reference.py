"""Independent references for the Markov model, written for clarity, not speed (shared by tests/markov).

`post_launch_reference` is the chain of docs/markov.md taken literally (states after launches, one request at a time);
`event_simulation` runs the closed loop event by event with random draws. Both know the completion extension:
a request committing its last token (probability `completion` per committed token) is replaced by a new one at
the entry: before the entry launches again if it finished on the entry, else just after that instant's
launches, which see the thresholds the core's policy gives for the live count (N minus those replacements).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque

import numpy as np
import scipy.sparse as sp

from tokenrouter.core.policy import clamp_thresholds
from tokenrouter.markov import stationary_distribution

LATE = -1  # destination of a finished request's replacement that arrives after the launches


def _destinations(i: int, routing: np.ndarray, commit: np.ndarray, completion: float) -> list[tuple[int, float]]:
    """(destination, probability) for one request leaving a step on model i (entry = 0)."""
    out: list[tuple[int, float]] = []
    for j in range(len(routing)):
        done = 1.0 - (1.0 - completion) ** commit[i][j]
        out.append((j, routing[i][j] * (1.0 - done)))
        out.append((0 if i == 0 else LATE, routing[i][j] * done))
    return [(j, p) for j, p in out if p > 0]


def post_launch_reference(
    d: list[int], routing: np.ndarray, commit: np.ndarray, b: tuple, n: int, completion: float = 0.0
) -> float:
    """T(B) in tokens per quantum: states (k, b, r) after launches, reward sum_{i in A} b_i c_ij p_ij."""
    m = len(d)

    def launch(k: list[int], run: list[int], res: list[int], live: int = n) -> None:
        bl = clamp_thresholds(b, live)
        for i in range(m):
            if run[i] == 0 and k[i] >= bl[i] and k[i] > 0:
                run[i], k[i], res[i] = k[i], 0, d[i]

    def outcomes(i: int, size: int) -> list[tuple[list[int], int, float]]:
        out = []
        for split in itertools.product(_destinations(i, routing, commit, completion), repeat=size):
            counts = [sum(1 for j, _ in split if j == dst) for dst in range(m)]
            out.append((counts, sum(1 for j, _ in split if j == LATE), math.prod(p for _, p in split)))
        return out

    k0, run0, res0 = [n] + [0] * (m - 1), [0] * m, [0] * m
    launch(k0, run0, res0)
    start = (*k0, *run0, *res0)
    ids, todo, edges = {start: 0}, deque([start]), []
    while todo:
        s = todo.popleft()
        k, run, res = list(s[:m]), list(s[m : 2 * m]), list(s[2 * m :])
        tau = min(res[i] for i in range(m) if run[i])
        done = [i for i in range(m) if run[i] and res[i] == tau]
        left = [res[i] - tau if run[i] else 0 for i in range(m)]
        for combo in itertools.product(*(outcomes(i, run[i]) for i in done)):
            kk, late, pr = list(k), 0, 1.0
            for counts, n_late, p in combo:
                kk = [a + c for a, c in zip(kk, counts, strict=True)]
                late += n_late
                pr *= p
            rr, rl = [0 if i in done else run[i] for i in range(m)], list(left)
            launch(kk, rr, rl, live=n - late)
            kk[0] += late
            launch(kk, rr, rl)
            t = (*kk, *rr, *rl)
            if t not in ids:
                ids[t] = len(ids)
                todo.append(t)
            edges.append((ids[s], ids[t], pr))
    size = len(ids)
    src, dst, pr = zip(*edges, strict=True)
    pi = stationary_distribution(sp.csr_matrix((pr, (src, dst)), shape=(size, size)))
    reward, hold = np.zeros(size), np.zeros(size)
    cbar = (np.asarray(commit) * np.asarray(routing)).sum(axis=1)
    for s, idx in ids.items():
        run, res = s[m : 2 * m], s[2 * m :]
        hold[idx] = min(res[i] for i in range(m) if run[i])
        reward[idx] = sum(run[i] * cbar[i] for i in range(m) if run[i] and res[i] == hold[idx])
    return float(pi @ reward / (pi @ hold))


def event_simulation(
    d: list[int],
    routing: np.ndarray,
    commit: np.ndarray,
    b: tuple,
    n: int,
    events: int,
    completion: float = 0.0,
    seed: int = 7,
) -> float:
    """Tokens per time unit of the closed loop by direct event simulation (integer times, one draw per request)."""
    rng = np.random.default_rng(seed)
    m = len(d)
    waiting, running = [n] + [0] * (m - 1), [0] * m
    heap: list[tuple[int, int]] = []
    now, tokens, t_warm, tok_warm = 0, 0.0, 0, 0.0
    cum = [np.cumsum(routing[i]).tolist() for i in range(m)]
    cum = [[*c[:-1], 2.0] for c in cum]  # the last destination catches rounding

    def launch(live: int = n) -> None:
        bl = clamp_thresholds(b, live)
        for i in range(m):
            if running[i] == 0 and waiting[i] >= bl[i] and waiting[i] > 0:
                running[i], waiting[i] = waiting[i], 0
                heapq.heappush(heap, (now + d[i], i))

    launch()
    for ev in range(events):
        now = heap[0][0]
        late = 0
        while heap and heap[0][0] == now:  # all completions at this instant first, then launches
            _, i = heapq.heappop(heap)
            for _ in range(running[i]):
                j = bisect.bisect_right(cum[i], rng.random())
                tokens += commit[i][j]
                if rng.random() >= (1.0 - completion) ** commit[i][j]:  # its last token: a new request
                    if i == 0:
                        waiting[0] += 1
                    else:
                        late += 1
                else:
                    waiting[j] += 1
            running[i] = 0
        launch(live=n - late)
        waiting[0] += late
        launch()
        if ev == events // 10:
            t_warm, tok_warm = now, tokens
    return (tokens - tok_warm) / (now - t_warm)
