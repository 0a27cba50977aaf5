"""Pausing autotune on a real `tokenrouter serve --autotune` (tiny CPU pair), one server for every check: paused
from the start, a load that makes autotune re-solve and move B within seconds (the bad B (1, 5) at N = 6 of
test_autotune_live.py) leaves B, the solve and change counters where they were; resumed, autotune solves and
changes B; a body that pauses and sets a static B does both, the pause first; a bad `autotune` is a 400."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from served import Served, fast_autotune_config, stream_completion

KEY = "pause-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CLIENTS = 6
TOKENS = 40
PAUSED_REQUESTS = 36  # three times the two generations of N the first solve waits for
PAUSED_S = 8.0  # 16 observe rounds; unpaused, this load moves B about 4 s in on a 2-core machine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autotune-pause")
    path = fast_autotune_config(tmp / "serve.yaml")
    srv = Served.start(tmp, path, extra=("--admin-key", KEY))
    yield srv
    srv.kill()


def _set(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/admin/policy", json=body, headers=AUTH, timeout=30)


def _get(url: str) -> dict[str, Any]:
    return httpx.get(url + "/admin/policy", headers=AUTH, timeout=10).json()


def _paused_metric(url: str) -> float:
    m = re.search(r"^tokenrouter_autotune_paused (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.M)
    assert m, "no tokenrouter_autotune_paused in /metrics"
    return float(m.group(1))


async def _load(url: str, stop: Callable[[int, dict[str, Any]], bool], deadline_s: float) -> list[dict[str, Any]]:
    """CLIENTS streaming clients until `stop(requests finished, GET /admin/policy)` (polled every 0.25 s) or the
    deadline; every poll's answer, with the number finished then under "finished"."""
    t0 = time.monotonic()
    finished = 0
    polls: list[dict[str, Any]] = []
    halt = asyncio.Event()
    async with httpx.AsyncClient(timeout=120) as client:

        async def monitor() -> None:
            while time.monotonic() - t0 < deadline_s:
                state = (await client.get(url + "/admin/policy", headers=AUTH)).json()
                polls.append({**state, "finished": finished})
                if stop(finished, state):
                    break
                await asyncio.sleep(0.25)
            halt.set()

        async def worker(k: int) -> None:
            nonlocal finished
            while not halt.is_set():
                s = await stream_completion(client, url, [10 + k, 20 + finished % 50, 30], TOKENS)
                assert s.error is None and s.finish_reason == "length", s.error
                finished += 1

        await asyncio.gather(monitor(), *(worker(k) for k in range(CLIENTS)))
    return polls


def test_paused_autotune_holds_b_under_a_load_it_would_retune_and_a_resume_runs_it_again(served):
    r = _set(served.url, {"autotune": False})
    assert r.status_code == 200, r.text
    assert r.json()["applied"]["autotune"]["paused"] is True and r.json()["applied"]["thresholds"] == [1, 5]
    assert _get(served.url)["autotune"]["paused"] is True and _paused_metric(served.url) == 1.0
    t0 = time.monotonic()
    paused = asyncio.run(_load(served.url, lambda n, _: n >= PAUSED_REQUESTS and time.monotonic() - t0 >= PAUSED_S,
                               deadline_s=180))  # fmt: skip
    log = served.log.read_text()
    assert paused[-1]["finished"] >= PAUSED_REQUESTS, log[-3000:]
    for state in paused:  # not one solve, not one change, B as started, at every poll
        assert state["thresholds"] == [1, 5] and state["autotune"]["paused"] is True, state
        assert state["autotune"]["solves"] == 0 and state["autotune"]["changes"] == 0, state
    assert "autotune: B " not in log

    r = _set(served.url, {"autotune": True})
    assert r.status_code == 200, r.text
    assert r.json()["applied"]["autotune"]["paused"] is False and _paused_metric(served.url) == 0.0
    resumed = asyncio.run(_load(served.url, lambda _, s: s["autotune"]["changes"] >= 1, deadline_s=180))
    log = served.log.read_text()
    last = resumed[-1]
    assert last["autotune"]["changes"] >= 1 and last["thresholds"] != [1, 5], log[-3000:]
    # The pause, not a slow machine, held B: resumed, the first solve came after fewer requests than the pause saw.
    first_solve = next(s["finished"] for s in resumed if s["autotune"]["solves"] >= 1)
    assert first_solve < paused[-1]["finished"], (first_solve, paused[-1]["finished"])
    lines = (
        "autotune: paused by the admin endpoint at delayed [1, 5]; B changes only",
        "autotune: resumed by the admin endpoint from delayed [1, 5]",
        "autotune: follows the policy set by the admin endpoint (delayed [1, 5])",
        "autotune: B ",
    )  # the first change: its old B is the one in force at the live N (1,5 or, at N = 4, 1,4)
    assert all(s in log for s in lines), ([s for s in lines if s not in log], log[-3000:])
    steps = [log.index(s) for s in lines]
    assert steps == sorted(steps), log[-3000:]


def test_a_body_that_pauses_and_sets_b_pauses_first_then_applies(served):
    before = _get(served.url)
    assert before["autotune"]["paused"] is False, "runs after the resume above"
    body = {"autotune": False, "policy": "delayed", "thresholds": [1, 5], "hop_rate": 0.2}
    r = _set(served.url, body)
    assert r.status_code == 200, r.text
    applied = r.json()["applied"]
    assert applied["thresholds"] == [1, 5] and applied["hop_rate"] == 0.2 and applied["autotune"]["paused"] is True
    log = served.log.read_text()
    pause = log.rindex("autotune: paused by the admin endpoint")
    assert pause < log.rindex("policy delayed thresholds [1, 5], hop rate 0.2"), log[-3000:]  # the subservers
    # A few seconds of load: B as the operator set it, no change; no solve but the one a round in flight at the
    # pause may finish (its decision is dropped: "paused meanwhile").
    changes, solves = applied["autotune"]["changes"], applied["autotune"]["solves"]
    t0 = time.monotonic()
    polls = asyncio.run(_load(served.url, lambda n, _: n >= 12 and time.monotonic() - t0 >= 3, deadline_s=120))
    for state in polls:
        assert state["thresholds"] == [1, 5] and state["autotune"]["changes"] == changes, state
        assert state["autotune"]["solves"] <= solves + 1, state


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"autotune": "false"}, "autotune"),
        ({"autotune": 0}, "autotune"),
        ({"autotune": True, "thresholds": [1, 2]}, "without 'policy'"),
        ({"autotune": True, "policy": "delayed", "thresholds": [1, 2, 3]}, "one value per model"),
    ],
)
def test_a_bad_body_with_autotune_is_a_400_and_changes_nothing(served, body, needle):
    before = _get(served.url)
    r = _set(served.url, body)
    assert r.status_code == 400 and needle in r.text, r.text
    after = _get(served.url)
    assert after["autotune"]["paused"] is before["autotune"]["paused"] is True, "runs while paused"
    assert {k: after[k] for k in ("policy", "thresholds", "hop_rate")} == {
        k: before[k] for k in ("policy", "thresholds", "hop_rate")
    }
