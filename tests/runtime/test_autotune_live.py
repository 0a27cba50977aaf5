"""Autotune on a real `tokenrouter serve` (tiny CPU pair): the front-end's controller, fed by the subservers' Stats,
changes B while requests stream, through the admin endpoint's path, and no token is lost or duplicated: every
request gets positions 0..n-1 once and ends with "length", the subservers' committed-token counters add up to
what the clients received, and the emit logs (`--record-hops`) hold each request's tokens exactly once.

The server starts from a deliberately bad B, (1, 5) at N = 6 (the large model waits for five of six requests), so
the Markov model predicts a large gain for another B whatever the CPU's step times are. A bench with hop-rate phases
then runs against the same server (the live path of `tr bench` phases)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
from served import Served, fast_autotune_config, stream_completion, terminate

KEY = "tune-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOKENS = 40
LONG_TOKENS = 200  # client 0's requests: one is in flight whenever autotune's change lands (others may be between)
CLIENTS = 6
BENCH_TOKENS = 16
RESULTS: dict[str, object] = {}  # what the tests before the last one sent (the last one checks the emit logs)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autotune")
    path = fast_autotune_config(tmp / "serve.yaml")
    hops = tmp / "hops.jsonl"
    srv = Served.start(tmp, path, extra=("--admin-key", KEY, "--record-hops", str(hops)))
    srv.hops = hops  # type: ignore[attr-defined]
    yield srv
    srv.kill()


def _changes(text: str) -> float:
    m = re.search(r"^tokenrouter_autotune_changes_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _thresholds(url: str) -> list[int]:
    text = httpx.get(url + "/metrics", timeout=10).text
    got = dict(re.findall(r'^tokenrouter_policy_threshold\{model="([^"]+)"\} (\S+)$', text, re.M))
    return [int(float(got[m])) for m in ("tiny-small", "tiny-large")]


async def _load_until_b_changes(url: str, deadline_s: float = 240.0):
    """CLIENTS streaming clients (client 0 asks LONG_TOKENS a request, the others TOKENS); a monitor polls /metrics.
    Returns (requests as (start, end, stream, tokens asked), (t_before, t_seen)) where the first change happened in
    (t_before, t_seen]; clients run two more requests each after it."""
    t0 = time.monotonic()
    now = lambda: time.monotonic() - t0  # noqa: E731
    done: list[tuple[float, float, object, int]] = []
    seen: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=120) as client:

        async def monitor() -> None:
            last = 0.0
            while "t_seen" not in seen and now() < deadline_s:
                t = now()
                if _changes((await client.get(url + "/metrics")).text) >= 1:
                    seen["t_before"], seen["t_seen"] = last, t
                    return
                last = t
                await asyncio.sleep(0.2)

        async def worker(k: int) -> None:
            after, tokens = 0, LONG_TOKENS if k == 0 else TOKENS
            while after < 2 and now() < deadline_s:
                start = now()
                s = await stream_completion(client, url, [10 + k, 20 + len(done) % 50, 30], tokens)
                done.append((start, now(), s, tokens))
                if "t_seen" in seen and start > seen["t_seen"]:
                    after += 1

        await asyncio.gather(monitor(), *(worker(k) for k in range(CLIENTS)))
    return done, seen


def test_autotune_changes_b_while_requests_stream_and_no_token_is_lost(served):
    assert _thresholds(served.url) == [1, 5]
    done, seen = asyncio.run(_load_until_b_changes(served.url))
    log = served.log.read_text()
    assert "t_seen" in seen, f"autotune never changed B:\n{log[-3000:]}"
    for _, _, s, n in done:
        assert s.error is None and s.done, s.error
        assert s.finish_reason == "length" and len(s.models) == n and s.usage["completion_tokens"] == n
    # The change landed while requests were running: a subserver applied it with requests live. (Read from the
    # server's log, not client timestamps: on a loaded machine one /metrics poll can outlast every request.)
    live = [int(n) for n in re.findall(r"policy delayed thresholds \[[\d, ]+\] \((\d+) requests live\)", log)]
    assert live and max(live) > 0, log[-3000:]
    # Logged with old B, new B, estimates and predicted gain; in force everywhere; GET /admin/policy says so.
    m = re.search(r"autotune: B (\S+) -> (\S+) \(predicted \+[\d.]+%, [\d,.]+ tok/s\) at N=\d+, hop [\d.]+/", log)
    assert m, log[-3000:]
    new = [int(x) for x in m.group(2).split(",")]
    state = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    assert state["policy"] == "delayed" and state["autotune"]["changes"] >= 1
    reverts = re.search(r"^tokenrouter_autotune_reverts_total (\S+)$", httpx.get(served.url + "/metrics").text, re.M)
    assert reverts and float(reverts.group(1)) == 0  # verification is off here
    # Two reads (the state above, the thresholds now) may straddle a later change under load: both must be B that
    # autotune logged as applied, and neither the starting one. The front-end logs a change once the subservers
    # took it, so /metrics can show a B a moment before its line is written: the log gets 10 s to catch up.
    now_b, deadline = _thresholds(served.url), time.monotonic() + 10
    while True:
        applied = [[int(x) for x in b.split(",")] for b in re.findall(
            r"autotune: B \S+ -> (\S+) \(predicted", served.log.read_text())]  # fmt: skip
        if (state["thresholds"] in applied and now_b in applied) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert state["thresholds"] in applied and now_b in applied, (state["thresholds"], now_b, applied)
    assert "policy delayed thresholds " + str(new) in log  # each subserver logged what it applied
    # Every committed token counted once by the subserver that wrote it: the counters add up to what clients got.
    want = sum(n for *_, n in done)
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(served.url + "/metrics", timeout=10).text
        got = sum(float(v) for v in re.findall(r'^tokenrouter_tokens_total\{model="[^"]+"\} (\S+)$', text, re.M))
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == want
    RESULTS["streamed"] = [n for *_, n in done]


def test_bench_hop_rate_phases_go_through_the_admin_endpoint(served, tmp_path):
    """`tr bench` with a phase that moves the hop rate: the server's rate follows, the policy autotune set stays,
    and autotune is not reset by a hop-rate change."""
    import subprocess
    import sys

    before = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    spec = tmp_path / "hop.json"
    spec.write_text(json.dumps({"workload": f"fixed:4,{BENCH_TOKENS}",
                                "phases": [{"at_s": 0, "hop_rate": 0.0}, {"at_s": 0.2, "hop_rate": 0.5}]}))  # fmt: skip
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "tokenrouter.cli.tr", "bench", "--url", served.url, "--workload", str(spec),
           "--num-requests", "200", "-n", "2", "--admin-key", KEY, "--json", str(out)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rec = json.loads(out.read_text())
    assert rec["requests_completed"] == 200 and rec["requests_failed"] == 0
    assert "phase at 0.0 s: hop rate 0.0" in p.stdout and "hop rate 0.5" in p.stdout
    after = httpx.get(served.url + "/admin/policy", headers=AUTH, timeout=10).json()
    assert after["hop_rate"] == 0.5
    assert after["policy"] == "delayed"
    assert "follows the policy set by the admin endpoint" not in served.log.read_text()
    assert after["autotune"]["changes"] >= before["autotune"]["changes"]
    RESULTS["bench"] = 200


def test_the_emit_logs_hold_every_token_once(served):
    assert RESULTS.get("streamed") and RESULTS.get("bench"), "runs after the two tests above"
    terminate(served)
    sums = [sum(n for _, n in json.loads(line)["runs"]) for line in served.hops.read_text().splitlines()]
    assert sorted(sums) == sorted([BENCH_TOKENS] * RESULTS["bench"] + RESULTS["streamed"])
