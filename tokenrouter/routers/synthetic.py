"""Synthetic routers: hop decisions drawn from a known process instead of a learned signal, so the simulator and
the runtime can be driven with a controlled hop pattern and checked against the Markov model (same P and C)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.request import Request
from tokenrouter.core.router import Router

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit ints whose outputs pass as independent uniform draws."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def hop_key(req: Request, seed: int) -> int:
    """A request's 64-bit key for hop draws: its sampling seed (what a client sends to repeat a request) and
    prompt, or, without a seed, the router's seed, its id and prompt. Cached on the request."""
    if req.hop_key is None:
        sp = req.sampling.seed
        who = f"s{sp}" if sp is not None else f"r{seed}:{req.rid}"
        h = hashlib.blake2b(who.encode(), digest_size=8)
        h.update(np.asarray(req.token_ids[: req.prompt_len], dtype=np.int64).tobytes())
        req.hop_key = int.from_bytes(h.digest(), "little")
    return req.hop_key


def hop_uniform(key: int, model: int, index: int, revisit: int = 0) -> float:
    """The uniform draw in [0, 1) of model `model` deciding after output token `index` of the request `key`; each
    `revisit` of the index is a new draw, or two models dropping to each other would repeat the same decisions."""
    x = key + 0x9E3779B97F4A7C15 * (index + 1) + 0xD1B54A32D192ED03 * (model + 1) + 0x8CB92BA72F3D8DD7 * revisit
    return (_mix64(x & _MASK64) >> 11) * (1.0 / (1 << 53))


def _revisit(req: Request, model: int) -> int:
    """How many times `model` decided at the request's current output index before, counting a new visit only when
    the request hopped in between (a row recomputed after a preemption draws the same); kept in `Request.extras`."""
    index, hops = req.num_output, req.num_hops
    visits = req.extras.setdefault("hop_visits", {})
    last = visits.get(model)
    n = 0 if last is None or last[0] != index else last[2] + (last[1] != hops)
    visits[model] = (index, hops, n)
    return n


class ProbRouter(Router):
    """Row from model i goes to model j with probability P[i][j]; on a hop i->j the sampled token is committed iff
    keep[i][j] (the Markov model's C). Each decision is a keyed draw (`hop_uniform`), not a stream, so a request's
    hops do not depend on its batch or on event order (docs/routers.md, "Hop draws")."""

    name = "prob"

    def __init__(self, P: Sequence[Sequence[float]], keep: Sequence[Sequence[bool]], seed: int = 0) -> None:
        m = len(P)
        if np.asarray(keep).shape != (m, m):
            raise ValueError(f"P and keep must be square {m}x{m} matrices")
        super().__init__(0, m)
        self.keep = [[bool(x) for x in row] for row in keep]
        self.seed = seed
        self.set_probabilities(P)

    def set_probabilities(self, P: Sequence[Sequence[float]] | np.ndarray) -> None:
        """New routing probabilities (another hop rate on a running deployment); `keep` and the draws stay."""
        P_arr = np.asarray(P, dtype=float)
        m = len(self.keep)
        if P_arr.shape != (m, m):
            raise ValueError(f"P and keep must be square {m}x{m} matrices")
        if (P_arr < 0).any() or not np.allclose(P_arr.sum(axis=1), 1.0):
            raise ValueError("each row of P must be probabilities summing to 1")
        self.P = P_arr
        self._cum = np.cumsum(P_arr, axis=1)
        # Plain-Python copies for the per-step draw (numpy calls cost more than the work at a few rows)
        self._cum_rows = self._cum.tolist()
        self._stays = [bool(P_arr[i][i] > 0) for i in range(len(P_arr))]
        self._sure = [next((j for j, p in enumerate(row) if p == 1.0), None) for row in P_arr.tolist()]

    def bind(self, model: int, num_models: int) -> Router:
        if num_models != len(self.P):
            raise ValueError(f"router has {len(self.P)} models, deployment has {num_models}")
        super().bind(model, num_models)
        return self

    def route(self, batch: Batch, result: StepResult) -> Sequence[int]:
        """Destination j of each row: the first j with u < cum[j] for the row's draw u (the last model past the
        end). The draw is keyed by the output index of the token this step sampled."""
        cum, last, model = self._cum_rows[self.model], self.num_models - 1, self.model
        sure = self._sure[model]
        if sure is not None:  # a certain destination (R2R's large model always hands back): nothing to draw
            return [sure] * len(batch.rows)
        out = []
        for row in batch.rows:
            req = row.req
            u = hop_uniform(hop_key(req, self.seed), model, req.num_output, _revisit(req, model))
            j = 0
            while j < last and u >= cum[j]:
                j += 1
            out.append(j)
        return out

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.keep[self.model][dst]

    def may_stay(self, req: Request) -> bool:
        return self._stays[self.model]


class TraceRouter(Router):
    """Replays recorded hops: `runs[rid]` lists (model, n_tokens) runs of committed output tokens. On model m, the
    token just sampled (output index c) is dropped and the row hops when another model wrote c; if m wrote it, it
    is committed and the row hops on when the writer of c+1 differs. Past the trace's end model 0 writes."""

    name = "trace"

    def __init__(self, runs: Mapping[str, Sequence[tuple[int, int]]]) -> None:
        super().__init__()
        self._writers: dict[str, np.ndarray] = {}
        for rid, rr in runs.items():
            seq = [int(m) for m, n in rr for _ in range(int(n))]
            self._writers[rid] = np.asarray(seq, dtype=np.int64)

    def bind(self, model: int, num_models: int) -> Router:
        for rid, w in self._writers.items():
            if len(w) and int(w.max()) >= num_models:
                raise ValueError(f"trace {rid!r} names model {int(w.max())} but the deployment has {num_models}")
        return super().bind(model, num_models)

    def writer(self, rid: str, index: int) -> int:
        w = self._writers.get(rid)
        return int(w[index]) if w is not None and 0 <= index < len(w) else 0

    def route(self, batch: Batch, result: StepResult) -> Sequence[int]:
        out = []
        for row in batch.rows:
            c = row.req.num_output  # index of the token this step sampled
            w = self.writer(row.req.rid, c)
            out.append(w if w != self.model else self.writer(row.req.rid, c + 1))
        return out

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.writer(req.rid, req.num_output - 1) == self.model
