"""Markov-chain throughput model of delayed batching and the threshold search (docs/markov.md). Analysis, not
scheduling: the simulator and `trsim tune` use it to choose B; the core never imports it."""

from __future__ import annotations

from tokenrouter.markov.model import MarkovModel, ThroughputResult, throughput
from tokenrouter.markov.presets import me_preset, r2r_preset, router_matrices, rstitch_preset
from tokenrouter.markov.search import evaluate_thresholds, search_thresholds
from tokenrouter.markov.solve import stationary_distribution
from tokenrouter.markov.steps import feasible_thresholds, quantize_steps

__all__ = ["MarkovModel", "ThroughputResult", "evaluate_thresholds", "feasible_thresholds", "me_preset",
    "quantize_steps", "r2r_preset", "router_matrices", "rstitch_preset", "search_thresholds",
    "stationary_distribution", "throughput"]  # fmt: skip
