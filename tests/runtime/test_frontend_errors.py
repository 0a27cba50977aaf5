"""Bad input gets a 4xx with an OpenAI error body and nothing reaches the subservers; the server keeps
serving. Plus the API key, a client disconnect (-> Abort) and a dead subserver (-> errors within 5 s)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from fake_backend import HANG, NAMES, REJECT
from live_server import start

from tokenrouter.models.tokenizer import TextTokenizer
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.params import MAX_CHOICES

MODEL = "+".join(NAMES)
JSON = {"content-type": "application/json"}


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": [1, 2], "model": "gpt-4"}, 404, "model"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": -3}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 5000]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, -1]}, 400, "prompt"),
        ({"model": MODEL, "prompt": []}, 400, "prompt"),
        (
            {"model": MODEL, "prompt": [1] * 600},
            400,
            "prompt",
        ),  # above the large model's KV (512), below the small one's
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 1100}, 400, "max_tokens"),  # beyond max_context_len
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 600}, 400, "max_tokens"),  # beyond the large model's KV
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": 12}, 400, None),
        ({"model": MODEL, "prompt": [1, 2], "n": MAX_CHOICES + 1}, 400, "n"),
        ({"model": MODEL, "prompt": [[1]] * 3, "n": MAX_CHOICES // 3 + 1}, 400, "prompt"),  # prompts x n
        ({"model": MODEL, "prompt": [[1], []]}, 400, "prompt.1"),  # a batch names the prompt at fault
        ({"model": MODEL, "prompt": [[1], [2, 5000]]}, 400, "prompt.1"),
        ({"model": MODEL, "prompt": [[1], [1] * 600]}, 400, "prompt.1"),
        ({"model": MODEL, "prompt": [1, 2], "temperature": -1}, 400, "temperature"),
        ({"model": MODEL, "prompt": [1, 2], "stop": ""}, 400, "stop"),
        ({"model": MODEL, "prompt": [1, 2], "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"model": MODEL, "max_tokens": 3}, 400, "prompt"),
        # the silent acceptances: no coercion, finite floats, model required, unsupported parameters
        ({"model": MODEL, "prompt": [True, False]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": "4"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 4.0}, 400, "max_tokens"),
        ({"prompt": [1, 2]}, 400, "model"),
        ({"model": MODEL, "prompt": [1, 2], "temperature": float("nan")}, 400, "temperature"),
        ({"model": MODEL, "prompt": [1, 2], "top_p": float("inf")}, 400, "top_p"),
        ({"model": MODEL, "prompt": [1, 2], "stream": 1}, 400, "stream"),
        ({"model": MODEL, "prompt": [1, 2], "logprobs": 6}, 400, "logprobs"),
        ({"model": MODEL, "prompt": [1, 2], "logprobs": True}, 400, "logprobs"),
        ({"model": MODEL, "prompt": [1, 2], "echo": True}, 400, "echo"),
        ({"model": MODEL, "prompt": [1, 2], "best_of": 2}, 400, "best_of"),
        ({"model": MODEL, "prompt": [1, 2], "suffix": "tail"}, 400, "suffix"),
        ({"model": MODEL, "prompt": [1, 2], "frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ({"model": MODEL, "prompt": [1, 2], "presence_penalty": -1}, 400, "presence_penalty"),
        ({"model": MODEL, "prompt": [1, 2], "logit_bias": {"5": 10}}, 400, "logit_bias"),
        # integer ranges: the wire carries int64 (seed) and int32 (top_k); nothing overflows into a 500
        ({"model": MODEL, "prompt": [1, 2], "seed": 2**63}, 400, "seed"),
        ({"model": MODEL, "prompt": [1, 2], "seed": 2**64 - 1}, 400, "seed"),
        ({"model": MODEL, "prompt": [1, 2], "seed": -(2**63) - 1}, 400, "seed"),
        ({"model": MODEL, "prompt": [1, 2], "seed": 2**200}, 400, "seed"),
        ({"model": MODEL, "prompt": [1, 2], "top_k": 2**64}, 400, "top_k"),
        ({"model": MODEL, "prompt": [1, 2], "top_k": 0}, 400, "top_k"),
        ({"model": MODEL, "prompt": [1, 2], "top_k": -2}, 400, "top_k"),
        ({"model": MODEL, "prompt": [1, 2], "n": 2**70}, 400, "n"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 2**70}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 2], "stop_token_ids": [2**40]}, 400, "stop_token_ids.0"),
        ({"model": MODEL, "prompt": [1, 2**40]}, 400, "prompt"),
        # JSON's \ud800 spells a lone surrogate: valid JSON, not valid Unicode (the tokenizer cannot take it)
        ({"model": MODEL, "prompt": "ab\ud800cd"}, 400, "prompt"),
        ({"model": MODEL, "prompt": ["\udfff"]}, 400, "prompt"),
    ],
)
def test_bad_completion_requests(small_kv, body, status, param):
    # json.dumps writes NaN/Infinity as Python's json.loads (and so the server) reads them; httpx refuses to
    r = httpx.post(small_kv.url + "/v1/completions", content=json.dumps(body), headers=JSON)
    assert_error(r, status, param)


@pytest.fixture(scope="module")
def small_kv():
    srv = start(capacity=(4096, 512), max_context_len=1024)
    yield srv
    srv.close()


CHAT_OK = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": CHAT_OK}, "model"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages.0.role"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        ({"model": MODEL, "messages": CHAT_OK, "logprobs": 1}, "logprobs"),
        ({"model": MODEL, "messages": CHAT_OK, "top_logprobs": 3}, "top_logprobs"),
        ({"model": MODEL, "messages": CHAT_OK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"model": MODEL, "messages": CHAT_OK, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"model": MODEL, "messages": CHAT_OK, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"model": MODEL, "messages": CHAT_OK, "tool_choice": "auto"}, "tool_choice"),
        ({"model": MODEL, "messages": CHAT_OK, "response_format": {"type": "json_object"}}, "response_format"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi \ud800"}]}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}, "messages"),
    ],
)
def test_bad_chat_requests(small_kv, body, param):
    r = httpx.post(small_kv.url + "/v1/chat/completions", content=json.dumps(body), headers=JSON)
    assert_error(r, 400, param)


def test_defaults_of_unsupported_parameters_are_accepted(small_kv):
    """Clients often send every parameter at its default: those are not refused."""
    body = {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, "echo": False, "best_of": 1, "frequency_penalty": 0,
            "presence_penalty": 0.0, "logit_bias": {}, "suffix": None, "user": "x", "stream_options": None}  # fmt: skip
    assert httpx.post(small_kv.url + "/v1/completions", json=body).status_code == 200
    chat = {"model": MODEL, "messages": [{"role": "developer", "content": "be brief"}, *CHAT_OK], "max_tokens": 2,
            "tools": None, "response_format": {"type": "text"}, "n": 1, "stop": None, "temperature": None}  # fmt: skip
    r = httpx.post(small_kv.url + "/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text


def test_bad_requests_never_reach_subservers_and_server_keeps_serving(small_kv):
    before = sum(isinstance(m, P.Submit) for m in small_kv.fake.received)
    assert_error(httpx.post(small_kv.url + "/v1/completions", content=b"{not json"), 400)
    assert_error(httpx.post(small_kv.url + "/v1/chat/completions", json={"model": MODEL, "messages": "hi"}), 400)
    assert_error(
        httpx.post(small_kv.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}), 400, "messages"
    )
    assert sum(isinstance(m, P.Submit) for m in small_kv.fake.received) == before
    r = httpx.post(small_kv.url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2], "max_tokens": 5})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_a_prompt_being_tokenized_does_not_stall_other_requests(small_kv, monkeypatch):
    """Tokenizing happens off the event loop: while one text prompt is in the tokenizer (held there until the
    other requests answered), /health and another completion are answered."""
    entered, release = threading.Event(), threading.Event()
    real = TextTokenizer.encode

    def held(self, text: str) -> list[int]:
        if text == "held":
            entered.set()
            release.wait(30)
        return real(self, text)

    monkeypatch.setattr(TextTokenizer, "encode", held)
    url, slow = small_kv.url, {}
    body = {"model": MODEL, "prompt": "held", "max_tokens": 3}
    t = threading.Thread(target=lambda: slow.update(r=httpx.post(url + "/v1/completions", json=body, timeout=60)))
    t.start()
    try:
        assert entered.wait(10)
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2], "max_tokens": 3}, timeout=5)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        release.set()
        t.join(30)
    assert slow["r"].status_code == 200 and slow["r"].json()["usage"]["completion_tokens"] == 3


def test_rejected_by_subserver_is_a_4xx_streaming_or_not(small_kv):
    assert_error(httpx.post(small_kv.url + "/v1/completions", json={"model": MODEL, "prompt": [REJECT, 1]}), 400)
    r = httpx.post(small_kv.url + "/v1/completions", json={"model": MODEL, "prompt": [REJECT, 1], "stream": True})
    assert_error(r, 400)


def test_api_key():
    srv = start(api_key="s3cret")
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": [1], "max_tokens": 2})
        assert_error(r, 401)
        assert_error(httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert httpx.get(srv.url + "/health").status_code == 200  # stays open
        ok = httpx.post(
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": [1], "max_tokens": 2},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200
    finally:
        srv.close()


def _wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_client_disconnect_mid_stream_sends_abort(live):
    # A raw socket so the connection really closes after the first SSE chunk.
    host, port = live.url.removeprefix("http://").split(":")
    body = b'{"model": "%s", "prompt": [3, 4], "max_tokens": 50, "seed": %d, "stream": true}' % (MODEL.encode(), HANG)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        got = b""
        while b"data: " not in got:
            got += s.recv(65536)
    assert _wait(lambda: len(live.fake.aborts()) == 1)
    submit = next(m for m in live.fake.received if isinstance(m, P.Submit))
    assert live.fake.aborts() == [submit.rid]


def test_dead_subserver_fails_in_flight_requests_and_health():
    srv = start()
    try:
        t0 = time.monotonic()
        with httpx.stream(
            "POST",
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": [3], "max_tokens": 50, "seed": HANG, "stream": True},
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            srv.fake.die(1)
            rest = [ln for ln in lines if ln.startswith("data: ")]
        assert time.monotonic() - t0 < 5
        assert '"error"' in rest[0] and "tiny-large" in rest[0]
        assert rest[-1] == "data: [DONE]"
        h = httpx.get(srv.url + "/health")
        assert h.status_code == 503 and "tiny-large" in h.json()["models"]
        assert httpx.head(srv.url + "/health").status_code == 503
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": [3], "max_tokens": 2}, timeout=5)
        assert_error(r, 503)
    finally:
        srv.close()


def test_missing_heartbeat_counts_as_dead():
    srv = start(heartbeat_timeout_s=0.3)
    try:
        srv.fake.close()  # stops answering but is_alive stays true: only the heartbeat tells
        assert _wait(lambda: httpx.get(srv.url + "/health").status_code == 503, 3)
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop: List should have at most 4 items"),  # its limit, not "no type"
        ({"stop": 5}, "stop: has none of the accepted types"),  # neither a string nor a list
        ({"max_tokens": "4"}, "max_tokens: "),
    ],
)
def test_a_union_parameter_says_which_limit_it_broke(small_kv, body, needle):
    r = httpx.post(small_kv.url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2], **body})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(needle), r.text
