"""The Markov model's side of a decision (`sim.decide`): a few candidate B at one N, in a fraction of a second.

Two budgeted searches (`tokenrouter.markov.search_thresholds`) on the deployment's step times at the workload's
mean context (`sim.tune.step_time_fns`): the models alone, then, when they share a GPU, each slowed by its peer as
often as the first search's best B keeps the peer busy. Their best B are merged (the co-located search's first).
The simulator then ranks them and searches around them, so a small state budget is enough here: a proposal only
has to start the search near the best.
"""

from __future__ import annotations

import math

from tokenrouter.markov import MarkovModel, search_thresholds
from tokenrouter.markov.colocation import DELTA_MS, peer_load, tokens_per_row
from tokenrouter.sim.decide import B, Proposals
from tokenrouter.sim.run import SimConfig
from tokenrouter.sim.tune import markov_inputs, check_search_concurrency, shares_a_gpu, step_time_fns

PROPOSAL_STATES = 20_000
"""State budget of each of the two searches (a few tenths of a second at N = 8, about one second at N = 64)."""


def propose(cfg: SimConfig, concurrency: int) -> Proposals:
    """The Markov model's candidates for `cfg`'s deployment at N, best first (module docstring)."""
    check_search_concurrency(concurrency)
    P, C, mean_output = markov_inputs(cfg)
    model = MarkovModel.create(step_time_fns(cfg), P, C, concurrency, DELTA_MS, mean_output)
    alone = search_thresholds(model, PROPOSAL_STATES)
    searches = [alone]
    if shares_a_gpu(cfg) and concurrency > 1 and alone.ranked and len(P) == 2:
        load = peer_load(alone.ranked[0], tokens_per_row(P))
        loaded = MarkovModel.create(step_time_fns(cfg, load), P, C, concurrency, DELTA_MS, mean_output)
        searches.insert(0, search_thresholds(loaded, PROPOSAL_STATES))
    ranked: dict[B, float] = {}
    for s in searches:  # each search's B* first, then the rest of their rankings
        ranked.setdefault(tuple(s.thresholds), math.nan if s.throughput_tok_s is None else s.throughput_tok_s)
    for s in searches:
        for r in s.ranked:
            ranked.setdefault(tuple(r.thresholds), r.throughput_tok_s)
    note = searches[0].note
    return Proposals(list(ranked.items()), note)
