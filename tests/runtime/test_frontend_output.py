"""What the front-end makes of the tokens, against the fake deployment over real HTTP and ZeroMQ: stop strings
(cut on the detokenized text, never streamed past, the request aborted on the subservers), chat content as text
parts, logprobs in both OpenAI shapes, and the request outcomes in /metrics.

References come from the fake's own token plan (`expected_output`, `expected_logprobs`) and the tokenizer's
`decode`/`token_bytes`, not from the server's answer.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from fake_backend import HANG, NAMES, expected_logprobs, expected_output
from live_server import start
from test_frontend_api import sse_events

from tokenrouter.runtime import protocol as P

MODEL = "+".join(NAMES)
PROMPT = [5, 9, 13]


@pytest.fixture(scope="module")
def srv():
    s = start()
    yield s
    s.close()


def _stop_reference(tok, ids: list[int], stop: str) -> tuple[str, int]:
    """(text before the first `stop`, tokens up to the one whose text completes it) by decoding prefixes."""
    text = tok.decode(ids)
    m = next(m for m in range(1, len(ids) + 1) if stop in tok.decode(ids[:m]))
    return text[: text.find(stop)], m


def _spanning_stop(tok, ids: list[int]) -> str:
    """A stop string that starts inside one token and ends inside the next."""
    a, b = tok.decode([ids[3]]), tok.decode([ids[4]])
    return a[-2:] + b[:2]


def _post(srv, path: str, body: dict) -> dict:
    r = httpx.post(srv.url + path, json={"model": MODEL, **body}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _aborted(srv, rid_count: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(srv.fake.aborts()) >= rid_count:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("pick", ["inside", "spanning", "first-token"])
def test_stop_string_cuts_the_text_and_aborts_the_request(srv, pick):
    tok = srv.tokenizer
    ids, models = expected_output(PROMPT, 12)
    text = tok.decode(ids)
    stop = {"inside": text[14:17], "spanning": _spanning_stop(tok, ids), "first-token": text[:2]}[pick]
    want, m = _stop_reference(tok, ids, stop)
    aborts = len(srv.fake.aborts())
    body = _post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "stop": [stop, "never there"]})
    ch = body["choices"][0]
    assert ch["text"] == want and ch["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == m < 12
    assert body["tokenrouter"]["tokens_per_model"] == {NAMES[0]: models[:m].count(0), NAMES[1]: models[:m].count(1)}
    assert _aborted(srv, aborts + 1), "the request must be ended on the subservers"


def test_stop_string_streamed_never_sends_text_past_the_stop(srv):
    tok = srv.tokenizer
    ids, _ = expected_output(PROMPT, 30)
    text = tok.decode(ids)
    # a stop string whose first characters appear earlier (they must be released once they cannot begin it)
    stop = text[40:44]
    want, m = _stop_reference(tok, ids, stop)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "stop": stop, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    so_far = ""
    for e in events[:-1]:
        so_far += e["choices"][0]["text"]
        assert want.startswith(so_far), "a delta released text that the stop string later cut"
    assert so_far == want
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == m
    assert sum(len(e["tokenrouter"]["models"]) for e in events[:-1]) == m


def test_stop_string_that_never_appears_changes_nothing(srv):
    ids, _ = expected_output(PROMPT, 12)
    body = _post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "stop": "\u2603"})
    assert body["choices"][0]["text"] == srv.tokenizer.decode(ids)
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 12


def test_chat_content_parts_are_joined_text(srv):
    tok = srv.tokenizer
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    body = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}], "max_tokens": 5})
    prompt = tok.encode_chat([{"role": "user", "content": "hello\nworld"}])
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["choices"][0]["message"]["content"] == tok.decode(expected_output(prompt, 5)[0])
    submit = [m for m in srv.fake.received if isinstance(m, P.Submit)][-1]
    assert P.unpack_ids(submit.prompt_ids) == prompt


def _completion_logprobs_reference(tok, n: int, k: int) -> dict:
    ids, _ = expected_output(PROMPT, n)
    lps = expected_logprobs(PROMPT, n, k)
    text = lambda i: tok.token_bytes(i).decode()  # noqa: E731
    top = []
    for i, e in zip(ids, lps, strict=True):
        d = {text(t): v for t, v in e.top}
        d.setdefault(text(i), e.logprob)
        top.append(d)
    return {
        "tokens": [text(i) for i in ids],
        "token_logprobs": [e.logprob for e in lps],
        "top_logprobs": top,
        "text_offset": [len(tok.decode(ids[:j])) for j in range(n)],
    }


@pytest.mark.parametrize("k", [0, 3])
def test_completion_logprobs_whole_and_streamed(srv, k):
    tok = srv.tokenizer
    want = _completion_logprobs_reference(tok, 9, k)
    body = _post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 9, "logprobs": k})
    assert body["choices"][0]["logprobs"] == want
    assert all(len(d) == k + (0 if k else 1) for d in want["top_logprobs"])  # the sampled id leads the top k
    req = {"model": MODEL, "prompt": PROMPT, "max_tokens": 9, "logprobs": k, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=req) as r:
        events = sse_events(r)[:-1]
    merged: dict[str, list] = {key: [] for key in want}
    for e in events:
        lp = e["choices"][0]["logprobs"]
        for key in merged:
            merged[key] += lp[key]
    assert merged == want


def test_chat_logprobs_whole_and_streamed(srv):
    tok = srv.tokenizer
    msgs = [{"role": "user", "content": "hi"}]
    prompt = tok.encode_chat(msgs)
    ids, _ = expected_output(prompt, 7)

    def entry(t: int, lp: float) -> dict:
        raw = tok.token_bytes(t)
        return {"token": raw.decode(), "logprob": lp, "bytes": list(raw)}

    want = [
        {**entry(t, e.logprob), "top_logprobs": [entry(a, v) for a, v in e.top]}
        for t, e in zip(ids, expected_logprobs(prompt, 7, 2), strict=True)
    ]
    body = _post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 7, "logprobs": True, "top_logprobs": 2})
    assert body["choices"][0]["logprobs"] == {"content": want}
    req = {"model": MODEL, "messages": msgs, "max_tokens": 7, "logprobs": True, "top_logprobs": 2, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=req) as r:
        events = sse_events(r)[:-1]
    assert [c for e in events for c in e["choices"][0]["logprobs"]["content"]] == want
    # no logprobs asked: none on the wire, null in the answer
    plain = _post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3})
    assert plain["choices"][0]["logprobs"] is None
    assert [m for m in srv.fake.received if isinstance(m, P.Submit)][-1].sampling.logprobs is None


def test_logprobs_stop_at_the_stop_string(srv):
    tok = srv.tokenizer
    ids, _ = expected_output(PROMPT, 12)
    stop = tok.decode(ids)[14:17]
    _, m = _stop_reference(tok, ids, stop)
    body = _post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "logprobs": 1, "stop": stop})
    lp = body["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [e.logprob for e in expected_logprobs(PROMPT, m, 1)]
    assert all(off <= len(body["choices"][0]["text"]) for off in lp["text_offset"])


def _outcomes(srv) -> dict[str, float]:
    out = {}
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith("tokenrouter_http_requests_total{"):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def test_outcomes_ok_error_aborted_and_in_flight():
    s = start()
    try:
        assert _outcomes(s) == {"ok": 0.0, "error": 0.0, "aborted": 0.0}
        _post(s, "/v1/completions", {"prompt": [1, 2], "max_tokens": 3})
        with httpx.stream("POST", s.url + "/v1/completions", json={"model": MODEL, "prompt": [1], "stream": True}) as r:
            sse_events(r)
        httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2], "max_tokens": 0})
        httpx.post(s.url + "/v1/completions", json={"prompt": [1, 2]})
        # a streamed request whose client leaves mid-stream
        body = b'{"model": "%s", "prompt": [3, 4], "seed": %d, "stream": true}' % (MODEL.encode(), HANG)
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            got = b""
            while b"data: " not in got:
                got += sock.recv(65536)
        deadline = time.monotonic() + 5
        while _outcomes(s).get("aborted") != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _outcomes(s) == {"ok": 2.0, "error": 2.0, "aborted": 1.0}
        assert "tokenrouter_http_requests_in_flight 0.0" in httpx.get(s.url + "/metrics").text
    finally:
        s.close()


def test_seeds_reach_the_subserver_unchanged_and_distinct(srv):
    """Seeds are signed 64-bit (OpenAI's type): each accepted seed reaches `SamplingParams.seed` as the same
    integer, so two seeds share a sampler seed only if they are equal; values outside int64 (2**64 - 1, which
    a uint64 reading would make equal to -1) are refused instead of wrapping."""
    seeds = [-(2**63), -(2**32), -1, 0, 1, 2**32, 2**32 + 1, 2**63 - 1]
    for seed in seeds:
        _post(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 1, "seed": seed})
    got = [m.sampling.seed for m in srv.fake.received if isinstance(m, P.Submit)][-len(seeds) :]
    assert got == seeds
    for seed in (2**64 - 1, 2**63, -(2**63) - 1):
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": [1], "seed": seed})
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
