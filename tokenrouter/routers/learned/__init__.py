"""Learned routers (R2R, CITER, Co-LLM, R-Stitch, ME) with device parts that run inside the engine step.

Needs torch (extra `engine`); `tokenrouter.routers` itself stays importable without it.
"""

from tokenrouter.routers.learned.calibrate import Calibratable, calibrate_on_runner
from tokenrouter.routers.learned.checkpoint import LoadedRouter, load_router_checkpoint, save_router_checkpoint
from tokenrouter.routers.learned.ensemble import EnsembleRouter
from tokenrouter.routers.learned.factory import LEARNED_ROUTERS, make_learned_router
from tokenrouter.routers.learned.r2r import R2R_INPUTS, R2RClassifier
from tokenrouter.routers.learned.routers import (
    CiterRouter,
    CoLLMRouter,
    LearnedRouter,
    OneTokenHandbackRouter,
    R2RRouter,
    RStitchRouter,
)
from tokenrouter.routers.learned.score_gate import ConstantDestination, ScoreGate, calibrate_threshold
from tokenrouter.routers.learned.scorers import ConfidenceMLP, DeferralHead, NormalizedEntropy

__all__ = [
    "LEARNED_ROUTERS",
    "R2R_INPUTS",
    "Calibratable",
    "CiterRouter",
    "CoLLMRouter",
    "ConfidenceMLP",
    "ConstantDestination",
    "DeferralHead",
    "EnsembleRouter",
    "LearnedRouter",
    "LoadedRouter",
    "NormalizedEntropy",
    "OneTokenHandbackRouter",
    "R2RClassifier",
    "R2RRouter",
    "RStitchRouter",
    "ScoreGate",
    "calibrate_on_runner",
    "calibrate_threshold",
    "load_router_checkpoint",
    "make_learned_router",
    "save_router_checkpoint",
]
