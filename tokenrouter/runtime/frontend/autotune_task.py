"""Autotune in the front-end process (`tr serve --autotune`; docs/autotune.md): every `observe_s` the core's
`AutotuneController` runs in a worker thread on the subservers' latest `Stats`; a decision goes through
`PolicyState.apply`, and an operator's change meanwhile wins."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from tokenrouter.core.autotune import AutotuneController, Decision
from tokenrouter.core.autotune_counters import CounterSnapshot, ModelCounters
from tokenrouter.core.config import PolicyConfig
from tokenrouter.runtime.frontend.admin import PolicyState
from tokenrouter.runtime.frontend.errors import APIError

log = logging.getLogger("tokenrouter.autotune")


def snapshot(backend: Any, entry: int) -> CounterSnapshot | None:
    """The counters as the latest `Stats` of every model report them (None until every model sent one)."""
    stats = [m.stats for m in backend.models]
    if any(s is None for s in stats):
        return None
    models = tuple(ModelCounters(s.tokens, s.hops, tuple(s.batch_steps), tuple(s.batch_rows), tuple(s.batch_ms))
                   for s in stats)  # fmt: skip
    return CounterSnapshot(models, stats[entry].live, backend.finished, backend.finished_tokens,
                           backend.finished_tokens_sq, tuple(backend.recent_outputs))  # fmt: skip


class AutotuneTask:
    """Only this task calls the controller (one call at a time): the worker thread never races the event loop."""

    def __init__(self, backend: Any, state: PolicyState, controller: AutotuneController, entry: int) -> None:
        self.backend, self.state, self.controller, self.entry = backend, state, controller, entry
        self.changes: list[Decision] = []
        self.last_gain: float | None = None
        self._reset: tuple[PolicyConfig, float] | None = None  # an operator's change, for the next round
        self._status = ""
        self._task: asyncio.Task | None = None
        self.paused = False  # by the operator (`switched`): no round observes or decides until resumed
        state.listeners.append(self._on_policy)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        cfg = self.controller.config
        log.info("autotune on: observe every %g s, re-solve every %g s (or on a %.0f%% move), apply at >= %.1f%% "
                 "predicted gain, hold %g s, %s", cfg.observe_s, cfg.interval_s, cfg.tolerance * 100,
                 cfg.min_gain * 100, cfg.hold_s, f"verify each change for {cfg.verify_s:g} s" if cfg.verify_s > 0
                 else "changes not verified")  # fmt: skip

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        close = getattr(self.controller.solve, "close", None)
        if close is not None:  # the solve's own process
            close()

    def _on_policy(self, policy: PolicyConfig, source: str) -> None:
        if source != "autotune":
            self._reset = (policy, self.backend.clock())

    @contextlib.contextmanager
    def switched(self, on: bool | None) -> Iterator[None]:
        """Around an operator's change, under `state.lock`: `on` False pauses before it, True resumes after it, None
        leaves autotune as it is; a change that raises leaves autotune as it was."""
        was = self.paused
        if on is False and not was:
            self.paused = True
            log.info("autotune: paused by the admin endpoint at %s; B changes only through it until resumed",
                     self._in_force())  # fmt: skip
        try:
            yield
        except BaseException:
            if self.paused != was:  # the pause and the refused change were one request: neither happened
                self.paused = was
                log.info("autotune: not paused after all: the change that came with the pause was refused")
            raise
        if on is True and was:
            self.paused = False
            if self.state.policy is not None:  # as after an operator's change: the next round starts afresh
                self._reset = (self.state.policy, self.backend.clock())
            log.info("autotune: resumed by the admin endpoint from %s", self._in_force())

    def _in_force(self) -> str:
        p = self.state.policy
        return "the policy in force" if p is None else f"{p.kind} {p.thresholds or p.table or ''}".rstrip()

    def describe(self) -> dict[str, Any]:
        """Autotune's state for GET /admin/policy."""
        c = self.controller
        return {"autotune": {"paused": self.paused, "changes": c.changes, "solves": c.solves, "status": c.status,
                             "estimates": c.estimates.as_dict() if c.estimates is not None else None,
                             "last_change": self.changes[-1].as_dict() if self.changes else None}}  # fmt: skip

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.controller.config.observe_s)
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:  # autotune must never take the front-end down
                log.exception("autotune: round failed; B unchanged")

    async def _round(self) -> None:
        if self.paused:  # nothing observed while paused: the resume resets the controller anyway
            return
        if self._reset is not None:
            policy, at = self._reset
            self._reset = None
            if not policy.is_sync:
                self.controller.reset(policy.build(), at)
                log.info("autotune: follows the policy set by the admin endpoint (%s %s)", policy.kind,
                         policy.thresholds or policy.table or "")  # fmt: skip
        if self.backend.unhealthy() or self.controller.policy.is_sync:
            return
        snap = snapshot(self.backend, self.entry)
        if snap is None:
            return
        version = self.state.version
        decision = await asyncio.to_thread(self.controller.observe, snap, self.backend.clock())
        for text in self.controller.notices:
            log.warning("%s", text)
        self.controller.notices.clear()
        if self.controller.status != self._status:
            self._status = self.controller.status
            log.debug("autotune: %s", self._status)
        if decision is not None:
            await self._apply(decision, version)

    async def _apply(self, d: Decision, version: int) -> None:
        async with self.state.lock:
            if self.paused:  # computed before the pause: a paused B is the operator's
                log.info("autotune: dropped %s: paused meanwhile", d.describe())
                return
            if self.state.version != version or self._reset is not None:
                log.info("autotune: dropped %s: the policy changed meanwhile", d.describe())
                return
            if self.state.policy is None:
                return
            policy = self.state.policy.with_thresholds(d.new)
            try:
                await self.state.apply(policy, source="autotune")
            except APIError as e:
                log.warning("autotune: %s not applied: %s", d.describe(), e.message)
                return
            self.controller.applied(d, policy.build())
            self.changes.append(d)
            self.last_gain = d.predicted_gain
        note = f"; {d.note}" if d.note else ""
        log.info("autotune: %s%s", d.describe(), note)
