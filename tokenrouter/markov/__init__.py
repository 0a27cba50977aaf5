"""Markov-chain throughput model of delayed batching and the threshold search (DESIGN section 9).

Analysis, not scheduling: the simulator and `trsim tune` use it to choose B; the core never imports it.
"""

from __future__ import annotations

from tokenrouter.markov.model import (
    MarkovChain,
    MarkovModel,
    ThresholdSearch,
    ThroughputResult,
    best_thresholds,
    throughput,
)
from tokenrouter.markov.presets import me_preset, r2r_preset, rstitch_preset
from tokenrouter.markov.solve import stationary_distribution
from tokenrouter.markov.steps import StepQuanta, StepSpec, feasible_thresholds, quantize_steps

__all__ = [
    "MarkovChain",
    "MarkovModel",
    "StepQuanta",
    "StepSpec",
    "ThresholdSearch",
    "ThroughputResult",
    "best_thresholds",
    "feasible_thresholds",
    "me_preset",
    "quantize_steps",
    "r2r_preset",
    "rstitch_preset",
    "stationary_distribution",
    "throughput",
]
