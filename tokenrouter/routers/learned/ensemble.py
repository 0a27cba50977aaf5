"""ME: a weighted ensemble of M >= 2 models that writes every token together (docs/routers.md, "The ensemble"): only
`top_k` ids and scores travel between models, and the last commits the combined choice (`Router.select_tokens`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.messages import PeerReq
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.core.router import Router

EXTRA_IDS, EXTRA_SCORES = "me_ids", "me_scores"
_CARRIED = "me"  # key in Request.extras: (ids, scores) received from the previous model


class EnsembleRouter(Router):
    name = "me"
    needs_logits = True

    def __init__(self, num_models: int = 3, weights: Sequence[float] | None = None, top_k: int = 16, seed: int = 0):
        if num_models < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {num_models}")
        w = [1.0 / num_models] * num_models if weights is None else [float(x) for x in weights]
        if len(w) != num_models or min(w) < 0 or sum(w) <= 0:
            raise ValueError(f"need {num_models} non-negative weights with a positive sum, got {w}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        super().__init__(0, num_models)
        self.weights = w
        self.top_k = int(top_k)
        self.seed = int(seed)
        self._stash: dict[str, tuple[list[int], list[float]]] = {}
        # rows that reached a later model without the previous models' scores (the driver did not pass the
        # message to `receive`); they restart the combination here. Should stay 0.
        self.num_uncarried = 0

    def bind(self, model: int, num_models: int) -> Router:
        if num_models != len(self.weights):
            raise ValueError(f"ensemble has {len(self.weights)} weights, the deployment has {num_models} models")
        super().bind(model, num_models)
        self._stash = {}
        return self

    @property
    def is_last(self) -> bool:
        return self.model == self.num_models - 1

    # ---- the per-step work -------------------------------------------------------------------------
    def select_tokens(self, batch: Batch, result: StepResult) -> Sequence[int] | Any:
        if result.logits is None:
            raise RuntimeError("the ensemble router needs the step's logits (needs_logits)")
        self._stash = {}
        toks = _to_list(result.next_token_ids)
        logp = torch.log_softmax(torch.as_tensor(result.logits).float(), dim=-1)
        rows = batch.rows
        # logits row j belongs to batch row lrows[j] (an engine returns the sampled rows only)
        lrows = list(range(len(rows))) if result.logit_rows is None else [int(i) for i in result.logit_rows]
        if len(lrows) != logp.shape[0]:
            raise ValueError(f"{logp.shape[0]} logits rows for {len(lrows)} logit rows")
        w = self.weights[self.model]
        carried = [rows[i].req.extras.get(_CARRIED) if self.model > 0 else None for i in lrows]
        k = min(self.top_k, logp.shape[-1])
        if self.model > 0:
            self.num_uncarried += sum(1 for c, i in zip(carried, lrows, strict=True) if c is None and rows[i].sample)
        if self.model == 0 or any(c is None for c in carried):  # a row without carried scores starts afresh
            own_vals, own_ids = (t.cpu().numpy() for t in logp.topk(k, dim=-1))
        if self.model == 0:
            ids, scores = own_ids, w * own_vals.astype(np.float64)
        elif not lrows:
            ids, scores = np.zeros((0, k), np.int64), np.zeros((0, k))
        else:
            ids = np.stack([np.asarray(c[0], np.int64) if c else own_ids[j] for j, c in enumerate(carried)])
            prior = np.stack([np.asarray(c[1], np.float64) if c else np.zeros(k) for c in carried])
            if ids.size and int(ids.max()) >= logp.shape[-1]:
                raise ValueError(f"candidate id {int(ids.max())} is outside model {self.model}'s vocabulary")
            got = logp.gather(1, torch.as_tensor(ids, device=logp.device)).cpu().numpy().astype(np.float64)
            scores = prior + w * got
        for j, i in enumerate(lrows):
            row = rows[i]
            if not row.sample:
                continue
            if self.is_last:
                toks[i] = self._choose(ids[j], scores[j], row.req)
            else:
                self._stash[row.req.rid] = (ids[j].tolist(), scores[j].tolist())
        return toks

    def _choose(self, ids: np.ndarray, scores: np.ndarray, req: Request) -> int:
        sp: SamplingParams = req.sampling
        if sp.temperature <= 0:
            return int(ids[int(np.argmax(scores))])
        order = np.argsort(-scores, kind="stable")
        z = scores[order] / sp.temperature
        if sp.top_k > 0:
            z = z[: sp.top_k]
        p = np.exp(z - z.max())
        p /= p.sum()
        if sp.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), sp.top_p) + 1)
            p = p[:keep] / p[:keep].sum()
        seed = self.seed if sp.seed is None else sp.seed
        rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(req.rid.encode()), req.num_output])
        return int(ids[order[int(rng.choice(len(p), p=p))]])

    # ---- routing and messages ----------------------------------------------------------------------
    def route(self, batch: Batch, result: StepResult) -> Sequence[int]:
        return [(self.model + 1) % self.num_models] * len(batch.rows)

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.is_last

    def extras(self, req: Request, dst: int) -> dict[str, Any] | None:
        got = self._stash.pop(req.rid, None)
        if got is None or dst == 0:
            return None
        return {EXTRA_IDS: got[0], EXTRA_SCORES: got[1]}

    def receive(self, msg: PeerReq, req: Request) -> None:
        super().receive(msg, req)
        ex = msg.extras or {}
        if EXTRA_IDS in ex:
            req.extras[_CARRIED] = (list(ex[EXTRA_IDS]), list(ex[EXTRA_SCORES]))
        else:
            req.extras.pop(_CARRIED, None)

    def on_finish(self, req: Request) -> None:
        self._stash.pop(req.rid, None)
        req.extras.pop(_CARRIED, None)


def _to_list(x: Any) -> list[int]:
    return [int(t) for t in (x.tolist() if hasattr(x, "tolist") else x)]
