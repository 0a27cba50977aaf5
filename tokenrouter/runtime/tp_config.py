"""What the launcher checks and sets for a model served with tensor parallelism (`models[i].tp > 1`), before it
starts any process. Light on purpose (no torch): the launcher process never imports the engine.

The ranks themselves are started by the model's subserver (rank 0), not by the launcher: `runtime.tp_ranks`.
"""

from __future__ import annotations

from tokenrouter.core.config import ConfigError, DeploymentConfig
from tokenrouter.deploy.placement import check_tp_divides


def check_tp(config: DeploymentConfig, device: str) -> None:
    """Refuse, with one line naming the model, a `tp` the model's heads cannot be split by, and on CUDA a `gpus`
    list that does not give one GPU per rank (rank r runs on `gpus[r]`). On CPU `gpus` is ignored."""
    for i, m in enumerate(config.models):
        if m.tp == 1:
            continue
        check_tp_divides(m.path or m.name, m.tp, name=f"{i} ({m.name})")  # an unloadable model: the subserver says
        if device == "cuda" and len(m.gpus) != m.tp:
            raise ConfigError(f"model {i} ({m.name}): tp {m.tp} needs one GPU per rank in gpus, got {m.gpus} "
                              f"({len(m.gpus)} GPUs)")  # fmt: skip
