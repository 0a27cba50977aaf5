"""Learned routers (R2R, CITER, Co-LLM, R-Stitch, ME) with device parts that run inside the engine step. Needs torch
(extra `engine`); `tokenrouter.routers` itself stays importable without it."""

from tokenrouter.routers.learned.calibrate import Calibratable, calibrate_on_runner
from tokenrouter.routers.learned.checkpoint import load_router_checkpoint, save_router_checkpoint
from tokenrouter.routers.learned.ensemble import EnsembleRouter
from tokenrouter.routers.learned.factory import make_learned_router
from tokenrouter.routers.learned.score_gate import ScoreGate, calibrate_threshold
from tokenrouter.routers.learned.scorers import ConfidenceMLP, DeferralHead

__all__ = ["Calibratable", "ConfidenceMLP", "DeferralHead", "EnsembleRouter", "ScoreGate", "calibrate_on_runner",
    "calibrate_threshold", "load_router_checkpoint", "make_learned_router", "save_router_checkpoint"]  # fmt: skip
