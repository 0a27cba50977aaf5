"""Engine exceptions. Each carries a one-line message that names the file, tensor or field at fault."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model cannot be built: bad or missing directory, config, weights, tensor names or shapes, or an
    architecture/feature this engine does not implement."""


class BatchError(ValueError):
    """A batch the engine cannot run as given. `rids` names the requests whose rows are at fault, so a caller can
    fail those and run the step without them; empty when the batch as a whole is at fault (docs/engine.md, Safety)."""

    def __init__(self, message: str, rids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.rids = rids


class EngineError(RuntimeError):
    """The engine cannot be built or used as configured (graph capture failed, memory budget too small, closed)."""


class StepFailed(RuntimeError):
    """A step's launch failed after validation (e.g. out of memory). The batch produced nothing usable; the
    engine stays usable, and a later from_prev row that refers to this step is an error."""
