"""Engine exceptions. Each carries a one-line message that names the file, tensor or field at fault."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model cannot be built: bad directory, config, weights, names or shapes, or an unsupported feature."""


class BatchError(ValueError):
    """A batch the engine cannot run as given; `rids`: the requests at fault, empty for the whole batch."""

    def __init__(self, message: str, rids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.rids = rids


class EngineError(RuntimeError):
    """The engine cannot be built or used as configured (graph capture failed, memory budget too small, closed)."""


class StepFailed(RuntimeError):
    """A step's launch failed after validation (e.g. OOM): its batch produced nothing; the engine stays usable."""
