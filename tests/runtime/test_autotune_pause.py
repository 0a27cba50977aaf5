"""Pausing autotune, without a server: `PolicyBody`'s `autotune` field, and `AutotuneTask` driven round by round
with a fake backend and a fake controller (whose every observation decides a change), so what a pause stops, what
a resume resets and which decision is dropped are exact. The live side: test_autotune_pause_live.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from tokenrouter.core.autotune import Decision
from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig
from tokenrouter.runtime.frontend.admin import PolicyBody, PolicyState
from tokenrouter.runtime.frontend.autotune_task import AutotuneTask
from tokenrouter.runtime.frontend.errors import APIError


class FakeBackend:
    """What `AutotuneTask` and `PolicyState` use of the backend: stats for a snapshot, a clock, `set_policy`."""

    def __init__(self) -> None:
        stats = SimpleNamespace(tokens=0, hops=0, batch_steps=[], batch_rows=[], batch_ms=[], live=1)
        self.models = [SimpleNamespace(stats=stats), SimpleNamespace(stats=stats)]
        self.finished = self.finished_tokens = self.finished_tokens_sq = 0
        self.recent_outputs: list[int] = []
        self.now = 100.0
        self.sent: list[list[int]] = []  # the thresholds of every SetPolicy

    def clock(self) -> float:
        return self.now

    def unhealthy(self) -> list[str]:
        return []

    async def set_policy(self, policy: PolicyConfig, hop_rate: float | None) -> list[str]:
        self.sent.append(list(policy.thresholds))
        return []


class FakeController:
    """Every `observe` decides B -> (1, 2) (after waiting on `gate` when set, to hold a round mid-solve)."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.config = SimpleNamespace(observe_s=0.01)
        self.policy = policy.build()
        self.notices: list[str] = []
        self.status, self.changes, self.solves, self.estimates = "", 0, 0, None
        self.observed = 0
        self.resets: list[tuple[list[int], float]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def observe(self, snap: Any, now: float) -> Decision:
        self.observed += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        est = SimpleNamespace(describe=lambda: "N=1")
        return Decision(now, tuple(self.policy.nominal_thresholds(1, 2)), (1, 2), est, 0.1, 100.0)  # type: ignore[arg-type]

    def applied(self, d: Decision, policy: Any) -> None:
        self.policy = policy
        self.changes += 1

    def reset(self, policy: Any, now: float) -> None:
        self.policy = policy
        self.resets.append((list(policy.nominal_thresholds(1, 2)), now))

    def solve(self) -> None: ...


def make() -> tuple[AutotuneTask, FakeBackend, FakeController, PolicyState]:
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
                           policy=PolicyConfig("delayed", [1, 5]))  # fmt: skip
    backend = FakeBackend()
    state = PolicyState(backend, 2, cfg)
    ctl = FakeController(cfg.policy)
    return AutotuneTask(backend, state, ctl, 0), backend, ctl, state  # type: ignore[arg-type]


async def admin(task: AutotuneTask, state: PolicyState, on: bool | None, thresholds: list[int] | None = None):
    """What POST /admin/policy does with `{"autotune": on, ...}`: under the lock, the switch around the change."""
    async with state.lock:
        with task.switched(on):
            if thresholds is not None:
                await state.apply(PolicyConfig("delayed", thresholds), None, source="admin")


def test_the_body_takes_autotune_alone_strictly_as_a_bool():
    assert PolicyBody.model_validate({"autotune": False}).policy_config() is None  # alone: valid, nothing to apply
    body = PolicyBody.model_validate({"autotune": True, "policy": "delayed", "thresholds": [2, 7], "hop_rate": 0.2})
    assert body.autotune is True and body.policy_config() == PolicyConfig("delayed", [2, 7])
    for bad in ("false", 0, 1, "yes", [True]):
        with pytest.raises(ValidationError):
            PolicyBody.model_validate({"autotune": bad})
    for body in ({"autotune": None}, {"thresholds": [1, 3], "autotune": False}, {}):
        with pytest.raises(APIError, match="without 'policy'"):
            PolicyBody.model_validate(body).policy_config()


def test_paused_rounds_neither_observe_nor_change_b_and_a_resume_restarts_from_the_b_in_force():
    task, backend, ctl, state = make()

    async def go() -> None:
        await admin(task, state, False)  # pause
        assert task.paused and task.describe()["autotune"]["paused"] is True
        for _ in range(3):
            await task._round()
        assert ctl.observed == 0 and backend.sent == [] and state.policy.thresholds == [1, 5]
        await admin(task, state, None, [1, 4])  # an operator's B while paused: autotune stays paused
        await task._round()
        assert ctl.observed == 0 and task.paused and ctl.resets == []
        backend.now = 200.0
        await admin(task, state, True)  # resume
        assert not task.paused and task.describe()["autotune"]["paused"] is False
        await task._round()
        # Reset to the B in force at the resume, at the resume's time; then observed and changed B.
        assert ctl.resets == [([1, 4], 200.0)] and ctl.observed == 1
        assert backend.sent == [[1, 4], [1, 2]] and state.policy.thresholds == [1, 2]

    asyncio.run(go())


def test_a_decision_computed_before_the_pause_is_dropped(caplog):
    task, backend, ctl, state = make()
    ctl.gate = threading.Event()

    async def go() -> None:
        round_ = asyncio.create_task(task._round())
        assert await asyncio.to_thread(ctl.entered.wait, 10)  # the round is solving
        await admin(task, state, False)
        ctl.gate.set()
        await round_

    with caplog.at_level(logging.INFO, logger="tokenrouter.autotune"):
        asyncio.run(go())
    assert ctl.observed == 1 and ctl.changes == 0 and backend.sent == [] and state.policy.thresholds == [1, 5]
    assert "paused meanwhile" in caplog.text


def test_pause_comes_before_the_change_resume_after_it_and_a_refused_change_undoes_either():
    task, _, ctl, state = make()

    async def go() -> None:
        seen: list[bool] = []
        async with state.lock:
            with task.switched(False):  # pause first: the change runs paused
                seen.append(task.paused)
            with task.switched(True):  # resume after: the change runs still paused
                seen.append(task.paused)
        assert seen == [True, True] and not task.paused
        with pytest.raises(APIError):
            await admin(task, state, False, [1, 2, 3])  # three thresholds for two models: 400
        assert not task.paused  # the pause it came with did not happen
        await admin(task, state, False)
        with pytest.raises(APIError):
            await admin(task, state, True, [1, 2, 3])
        assert task.paused and ctl.resets == []  # still paused, nothing reset
        await admin(task, state, False)  # pausing what is paused, resuming what runs: nothing
        assert task.paused
        await admin(task, state, True)
        await admin(task, state, True)
        await task._round()
        assert len(ctl.resets) == 1

    asyncio.run(go())
