"""Deliberate engine failures, for tests of the code that handles real ones (docs/engine.md, Safety). A failed step
raises `InjectedFault` after the upload, before any pass, where an out-of-memory error would (`StepFailed`); a
failed capture in the graph build (`EngineError`; with PDL after one retry without it, a second failure)."""

from __future__ import annotations

from dataclasses import dataclass, field


class InjectedFault(RuntimeError):
    """A failure raised on purpose by `FaultInjection`."""


@dataclass(slots=True)
class FaultInjection:
    fail_step_ids: set[int] = field(default_factory=set)  # batch step ids whose launch fails, once each
    fail_next_steps: int = 0  # the next this many launches fail
    fail_captures: int = 0  # the next this many graph builds fail (CUDA capture, or `graph_emulation`)

    def before_passes(self, step_id: int) -> None:
        """Called by `Engine.step` once the inputs are on the device, before the first pass."""
        if step_id in self.fail_step_ids:
            self.fail_step_ids.discard(step_id)
            raise InjectedFault(f"injected failure of step {step_id}")
        if self.fail_next_steps > 0:
            self.fail_next_steps -= 1
            raise InjectedFault(f"injected failure of step {step_id}")

    def before_capture(self) -> None:
        """Called by the engine's graph build before it captures (or emulates) any graph."""
        if self.fail_captures > 0:
            self.fail_captures -= 1
            raise InjectedFault("injected graph capture failure")
