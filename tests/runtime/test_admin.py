"""The admin endpoint on a real `tokenrouter serve` (tiny CPU pair): a policy, thresholds and hop rate set while
serving take effect on the next request everywhere; it needs its own key; what cannot change live is refused."""

from __future__ import annotations

import httpx
import pytest
from served import Served, write_config

KEY = "adm1n"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin")
    srv = Served.start(tmp, write_config(tmp / "serve.yaml", "r2r", hop_rate=0.3),
                       extra=("--admin-key", KEY, "--api-key", "user"))  # fmt: skip
    yield srv
    srv.kill()


def _hops(url: str, n: int = 48) -> int:
    body = {"model": "tiny-small+tiny-large", "prompt": [5, 6, 7], "max_tokens": n, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer user"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokenrouter"]["hops"]


def _set(url: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url + "/admin/policy", json=body, headers=AUTH if headers is None else headers, timeout=30)


def test_hop_rate_and_thresholds_change_while_serving(served):
    got = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    assert got["policy"] == "eager" and got["hop_rate"] == 0.3  # what the server started with
    assert _hops(served.url) > 0
    r = _set(served.url, {"policy": "delayed", "thresholds": [1, 1], "hop_rate": 0.0})
    assert r.status_code == 200, r.text
    assert _hops(served.url) == 0  # p = 0 on both subservers from the next request on
    r = _set(served.url, {"policy": "eager", "hop_rate": 1.0})
    assert r.status_code == 200, r.text
    # p = 1: every small-model step hops; the large model writes one token and hands back.
    assert _hops(served.url, 20) >= 9
    got = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    assert got["policy"] == "eager" and got["hop_rate"] == 1.0 and got["thresholds"] == []


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"policy": "step-sync"}, 409, "restart"),
        ({"policy": "delayed", "thresholds": [1, 2, 3]}, 400, "one value per model"),
        ({"policy": "delayed", "thresholds": [0, 1]}, 400, "thresholds"),
        ({"policy": "fastest"}, 400, "policy"),
        ({"policy": "eager", "hop_rate": 1.5}, 400, "hop_rate"),
        ({"policy": "eager", "color": "red"}, 400, "color"),
        # Without --autotune, a body with `autotune` is refused whole: the policy and hop rate with it are not applied.
        ({"autotune": False}, 409, "this server runs without autotune: start it with --autotune"),
        ({"autotune": False, "policy": "delayed", "thresholds": [2, 7], "hop_rate": 0.2}, 409, "--autotune"),
        ({"autotune": "off"}, 400, "autotune"),
    ],
)
def test_bad_changes_are_refused_and_change_nothing(served, body, status, needle):
    before = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    r = _set(served.url, body)
    assert r.status_code == status and needle in r.text, r.text
    assert httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json() == before


def test_the_admin_key_is_required_and_separate(served):
    assert _set(served.url, {"policy": "eager"}, headers={}).status_code == 401
    assert _set(served.url, {"policy": "eager"}, headers={"Authorization": "Bearer user"}).status_code == 401
    assert httpx.get(served.url + "/admin/policy", timeout=10).status_code == 401


def test_a_hop_rate_alone_keeps_the_policy_in_force(served):
    r = _set(served.url, {"policy": "delayed", "thresholds": [1, 2], "hop_rate": 0.3})
    assert r.status_code == 200, r.text
    text = httpx.get(served.url + "/metrics", headers={"Authorization": "Bearer user"}, timeout=10).text
    assert 'tokenrouter_policy_threshold{model="tiny-small"} 1.0' in text
    assert 'tokenrouter_policy_threshold{model="tiny-large"} 2.0' in text
    r = _set(served.url, {"hop_rate": 0.0})
    assert r.status_code == 200, r.text
    got = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    assert got["policy"] == "delayed" and got["thresholds"] == [1, 2] and got["hop_rate"] == 0.0
    assert _hops(served.url) == 0
    for body in ({"thresholds": [1, 3]}, {}, {"thresholds": [1, 3], "hop_rate": 0.1}):
        r = _set(served.url, body)
        assert r.status_code == 400 and "without 'policy'" in r.text, r.text
    assert httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json() == got


def test_the_policy_in_force_names_the_default_thresholds():
    """A delayed policy configured without thresholds runs B = 1 for every model: GET /admin/policy says [1, 1],
    as the start-up banner does, so that the body can be posted back as it is; other kinds have none."""
    from dataclasses import replace

    from rt_helpers import tiny_config

    from tokenrouter.core.config import PolicyConfig
    from tokenrouter.core.policy import PolicyKind
    from tokenrouter.runtime.frontend.admin import PolicyState

    cfg = tiny_config()
    delayed = PolicyState(None, 2, replace(cfg, policy=PolicyConfig(PolicyKind.DELAYED)))
    assert delayed.describe()["thresholds"] == [1, 1]
    assert delayed.policy.build().nominal_thresholds(8, 2) == (1, 1)  # what the scheduler runs
    given = PolicyState(None, 2, replace(cfg, policy=PolicyConfig(PolicyKind.DELAYED, [2, 7])))
    assert given.describe()["thresholds"] == [2, 7]
    assert PolicyState(None, 2, replace(cfg, policy=PolicyConfig(PolicyKind.EAGER))).describe()["thresholds"] == []
