"""Algorithm presets: the hand-back semantics of each routing algorithm, with a synthetic hop signal.

| preset | small -> large | large does | hands back |
| r2r, citer, co-llm | hop w.p. p, small token dropped | regenerates one token (committed) | after 1 token |
| r-stitch | hop w.p. p, small token dropped | keeps writing (committed) | w.p. q per token (geometric run) |
| markov | as r-stitch with p = 1/mean_small_run, q = 1/mean_large_run |
| me | every token visits models 0..M-1 in turn; only the last commits (it combines the logits) |

The learned routers (`tokenrouter.routers.learned`: R2R's MLP, CITER's confidence, Co-LLM's deferral head,
R-Stitch's entropy) replace the synthetic draw with their signal; the semantics here stay.
"""

from __future__ import annotations

from tokenrouter.core.config import check_prob
from tokenrouter.core.names import RouterName
from tokenrouter.routers.synthetic import ProbRouter

PRESETS = tuple(r.value for r in RouterName if r is not RouterName.TRACE)


def two_model_matrix(p: float, q: float = 1.0) -> list[list[float]]:
    """Small hops to large w.p. `p` per step; large hands back w.p. `q` per token (1: after one token)."""
    p, q = check_prob(p, "hop rate"), check_prob(q, "return probability")
    return [[1 - p, p], [q, 1 - q]]


def one_token_handback(p: float, seed: int = 0) -> ProbRouter:
    return ProbRouter(two_model_matrix(p), [[True, False], [True, True]], seed)


def geometric_run(p: float, q: float, seed: int = 0) -> ProbRouter:
    return ProbRouter(two_model_matrix(p, q), [[True, False], [True, True]], seed)


def set_hop_rate(router: object, name: str, hop_rate: float, return_prob: float = 1.0) -> None:
    """Retarget a running preset router to another hop rate (its semantics unchanged). ValueError for routers
    whose hops are not a synthetic draw of the hop rate (learned, trace, ensemble, markov)."""
    key = str(name).lower()
    if not isinstance(router, ProbRouter) or key not in (RouterName.R2R, RouterName.CITER, RouterName.CO_LLM,
                                                         RouterName.R_STITCH, "hop-rate"):  # fmt: skip
        raise ValueError(f"router {name!r} has no synthetic hop rate to change (learned routers calibrate theirs)")
    q = return_prob if key == RouterName.R_STITCH else 1.0
    router.set_probabilities(two_model_matrix(hop_rate, q))


def ensemble(num_models: int, seed: int = 0) -> ProbRouter:
    if num_models < 2:
        raise ValueError(f"an ensemble needs at least 2 models, got {num_models}")
    m = num_models
    P = [[1.0 if j == (i + 1) % m else 0.0 for j in range(m)] for i in range(m)]
    keep = [[i == m - 1 for _ in range(m)] for i in range(m)]
    return ProbRouter(P, keep, seed)


def make_preset(
    name: str,
    *,
    hop_rate: float = 0.1,
    return_prob: float = 1.0,
    mean_small_run: float | None = None,
    mean_large_run: float | None = None,
    num_models: int = 2,
    seed: int = 0,
) -> ProbRouter:
    key = name.lower()
    if key in (RouterName.R2R, RouterName.CITER, RouterName.CO_LLM, "hop-rate"):
        return one_token_handback(hop_rate, seed)
    if key == RouterName.R_STITCH:
        return geometric_run(hop_rate, return_prob, seed)
    if key == RouterName.MARKOV:
        if not mean_small_run or not mean_large_run or mean_small_run < 1 or mean_large_run < 1:
            raise ValueError("markov router needs mean run lengths >= 1 on both models")
        return geometric_run(1.0 / mean_small_run, 1.0 / mean_large_run, seed)
    if key == RouterName.ME:
        return ensemble(num_models, seed)
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(r.value for r in RouterName)}")
