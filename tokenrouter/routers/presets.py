"""Algorithm presets: each routing algorithm's hop law (`tokenrouter.core.hop_law`) with a synthetic hop signal;
the learned routers (`tokenrouter.routers.learned`) replace the draw with their signal, the semantics stay.
"""

from __future__ import annotations

from tokenrouter.core.config import RouterConfig
from tokenrouter.core.hop_law import SYNTHETIC_HOP_RATE, HopLaw, hop_law
from tokenrouter.routers.synthetic import ProbRouter


def router_law(rc: RouterConfig, num_models: int) -> HopLaw:
    """The hop law of a deployment's router over its `num_models` models (ValueError for one without a law)."""
    return hop_law(rc.name, num_models, hop_rate=rc.hop_rate, return_prob=rc.return_prob,
                   mean_small_run=rc.mean_small_run, mean_large_run=rc.mean_large_run)  # fmt: skip


def synthetic_router(law: HopLaw, seed: int = 0) -> ProbRouter:
    """A router that draws its hops from `law`."""
    return ProbRouter(law.routing, law.commit, seed)


def set_hop_rate(router: object, name: str, hop_rate: float, return_prob: float = 1.0) -> None:
    """Retarget a running preset router to another hop rate (its semantics unchanged). ValueError for routers
    whose hops are not a synthetic draw of the hop rate (learned, trace, ensemble, markov)."""
    if not isinstance(router, ProbRouter) or str(name).lower() not in SYNTHETIC_HOP_RATE:
        raise ValueError(f"router {name!r} has no synthetic hop rate to change (learned routers calibrate theirs)")
    router.set_probabilities(hop_law(name, hop_rate=hop_rate, return_prob=return_prob).routing)
