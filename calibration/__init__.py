"""Profiles (schema, load/save), the cost model the simulator runs on, and the analytic profile generator.

Import as `tokenrouter.calibration` (the `calibration/` folder is mapped into the namespace). No torch here:
the simulator installs light.
"""

from tokenrouter.core.config import PLACEMENTS
from tokenrouter.core.names import Placement

from .cost import (
    ConstantCost,
    ConstantModelCost,
    CostModel,
    ModelCost,
    ModelStepCost,
    StepCost,
)
from .profile import (
    DEFAULT_PROFILE,
    SCHEMA_VERSION,
    GpuInfo,
    LinkInfo,
    ModelProfile,
    MpsInfo,
    Profile,
    ProfileError,
    StdServingInfo,
    StepCoeffs,
    StepModes,
    bundled_profile_names,
    load_profile,
)
from .step_stats import PartStats, StepStats

__all__ = [
    "DEFAULT_PROFILE",
    "PLACEMENTS",
    "SCHEMA_VERSION",
    "ConstantCost",
    "ConstantModelCost",
    "CostModel",
    "GpuInfo",
    "LinkInfo",
    "ModelCost",
    "ModelProfile",
    "ModelStepCost",
    "MpsInfo",
    "PartStats",
    "Placement",
    "Profile",
    "ProfileError",
    "StdServingInfo",
    "StepCoeffs",
    "StepCost",
    "StepModes",
    "StepStats",
    "bundled_profile_names",
    "load_profile",
]
