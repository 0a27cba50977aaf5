"""Profiles (schema, load/save), the cost model the simulator runs on, and the analytic profile generator, imported
as `tokenrouter.calibration`. No torch here: the simulator installs light."""

from .cost import ConstantCost, CostModel, ModelStepCost, StepCost
from .profile import Profile, ProfileError
from .resolve import load_profile
from .step_stats import PartStats, StepStats

__all__ = ["ConstantCost", "CostModel", "ModelStepCost", "PartStats", "Profile", "ProfileError", "StepCost",
           "StepStats", "load_profile"]  # fmt: skip
