"""Algorithm presets: each routing algorithm's hand-back semantics (its hop law, `tokenrouter.core.hop_law`) with a
synthetic hop signal.

The learned routers (`tokenrouter.routers.learned`: R2R's MLP, CITER's confidence, Co-LLM's deferral head,
R-Stitch's entropy) replace the synthetic draw with their signal; the semantics stay.
"""

from __future__ import annotations

from tokenrouter.core import hop_law as law
from tokenrouter.core.names import RouterName
from tokenrouter.routers.synthetic import ProbRouter

PRESETS = tuple(r.value for r in RouterName if r is not RouterName.TRACE)


def law_router(hl: law.HopLaw, seed: int = 0) -> ProbRouter:
    """A router that draws its hops from `hl`."""
    return ProbRouter(hl.routing, hl.commit, seed)


def one_token_handback(p: float, seed: int = 0) -> ProbRouter:
    return law_router(law.geometric_run(p), seed)


def geometric_run(p: float, q: float, seed: int = 0) -> ProbRouter:
    return law_router(law.geometric_run(p, q), seed)


def ensemble(num_models: int, seed: int = 0) -> ProbRouter:
    return law_router(law.ensemble(num_models), seed)


def set_hop_rate(router: object, name: str, hop_rate: float, return_prob: float = 1.0) -> None:
    """Retarget a running preset router to another hop rate (its semantics unchanged). ValueError for routers
    whose hops are not a synthetic draw of the hop rate (learned, trace, ensemble, markov)."""
    if not isinstance(router, ProbRouter) or str(name).lower() not in law.SYNTHETIC_HOP_RATE:
        raise ValueError(f"router {name!r} has no synthetic hop rate to change (learned routers calibrate theirs)")
    router.set_probabilities(law.hop_law(name, hop_rate=hop_rate, return_prob=return_prob).routing)


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
    """The synthetic router of algorithm `name` (ValueError for one without a hop law, `tokenrouter.core.hop_law`)."""
    hl = law.hop_law(name, num_models, hop_rate=hop_rate, return_prob=return_prob, mean_small_run=mean_small_run,
                     mean_large_run=mean_large_run)  # fmt: skip
    return law_router(hl, seed)
