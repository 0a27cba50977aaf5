"""Property-based test of the request schemas over real HTTP (uvicorn, the fake deployment): whatever body a
client sends to `/v1/completions` or `/v1/chat/completions` (valid-ish, wrong types, huge or negative ints at
the int64/uint64 edges, NaN and infinities, nested junk, unknown keys, bytes that are not JSON), the answer is
never a 5xx, a 4xx has OpenAI's error shape, and the same keep-alive connection answers a valid request next.
"""

from __future__ import annotations

import http.client
import json

import pytest
from fake_backend import NAMES
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from live_server import start

MODEL = "+".join(NAMES)
VALID = json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}).encode()

EDGES = [2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**200]
ints = st.one_of(st.integers(-3, 40), st.sampled_from(EDGES), st.sampled_from(EDGES).map(lambda x: -x))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, 2.0, -0.0]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=8))
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
bad = st.one_of(junk, ints, floats)  # what a mutation puts in a field

# A quarter of the texts carry a lone surrogate: JSON's \ud800 escapes spell one, so it is valid JSON but not valid
# Unicode (hypothesis' text() never draws one).
lone_surrogate = st.integers(0xD800, 0xDFFF).map(chr)
plain = st.text(min_size=1, max_size=16)
text = st.one_of(plain, plain, plain, st.tuples(st.text(max_size=8), lone_surrogate, st.text(max_size=8)).map("".join))
token_ids = st.lists(st.integers(0, 1023), min_size=1, max_size=8)
VALID_COMMON = {
    "max_tokens": st.integers(1, 12),
    "temperature": st.floats(0.0, 2.0),
    "top_p": st.floats(0.01, 1.0),
    "top_k": st.one_of(st.just(-1), st.integers(1, 2**31 - 1)),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "n": st.just(1),
    "stream": st.booleans(),
    "stop": st.one_of(st.none(), text, st.lists(text, max_size=4)),
    "stop_token_ids": st.lists(st.integers(0, 1023), max_size=3),
    "ignore_eos": st.booleans(),
    "frequency_penalty": st.just(0),
    "user": st.text(max_size=8),
}
VALID_COMPLETION = {**VALID_COMMON, "logprobs": st.integers(0, 5), "echo": st.just(False)}
VALID_CHAT = {**VALID_COMMON, "logprobs": st.booleans(), "max_completion_tokens": st.integers(1, 12)}
content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
                                   min_size=1, max_size=3))  # fmt: skip
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": content}
)
REQUIRED = {
    "/v1/completions": {
        "model": st.sampled_from([MODEL, *NAMES]),
        "prompt": st.one_of(text, token_ids, st.lists(text, min_size=1, max_size=1), st.lists(token_ids, min_size=1,
                                                                                             max_size=1)),
    },
    "/v1/chat/completions": {"model": st.sampled_from([MODEL, *NAMES]), "messages": st.lists(message, min_size=1,
                                                                                             max_size=3)},
}  # fmt: skip
OPTIONAL = {"/v1/completions": VALID_COMPLETION, "/v1/chat/completions": VALID_CHAT}
# Fields a mutation may break: every known one, OpenAI parameters this server refuses, and unknown keys.
MUTABLE = sorted({*VALID_COMPLETION, *VALID_CHAT, "model", "prompt", "messages", "top_logprobs", "best_of", "echo",
                  "suffix", "logit_bias", "tools", "response_format", "stream_options", "unknown"})  # fmt: skip


INT_FIELDS = {
    "/v1/completions": ["seed", "top_k", "max_tokens", "n", "logprobs", "stop_token_ids", "prompt"],
    "/v1/chat/completions": ["seed", "top_k", "max_tokens", "n", "top_logprobs", "max_completion_tokens",
                             "stop_token_ids"],
}  # fmt: skip
FLOAT_FIELDS = ["temperature", "top_p", "frequency_penalty", "presence_penalty"]
# Both sides of int32, int64 and uint64 (what the wire and the sampler carry) and far beyond; the values past
# what msgpack can carry come first (hypothesis draws early elements of a `sampled_from` more often).
edge_ints = st.sampled_from([2**64, -(2**63) - 1, 2**200, -(2**64), 2**63, 2**64 - 1, -(2**63), 2**63 - 1, 2**31,
                             2**31 - 1, -(2**200)])  # fmt: skip
non_finite = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308 * 10])


@st.composite
def bodies(draw, path: str) -> dict:
    """A valid request, then 0-2 mutations: an integer field at an int32/int64/uint64 edge, a float field not
    finite, any field set to junk, or a required key dropped. Mutating one field of an otherwise valid body is
    what reaches the code behind the schema (the wire encoding, the sampler's seed)."""
    body = draw(st.fixed_dictionaries(REQUIRED[path], optional=OPTIONAL[path]))
    if path == "/v1/chat/completions" and body.get("logprobs") and draw(st.booleans()):
        body["top_logprobs"] = draw(st.integers(0, 20))
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        how = draw(st.sampled_from(["int", "int", "int", "float", "junk"]))
        if how == "int":
            key, v = draw(st.sampled_from(INT_FIELDS[path])), draw(edge_ints)
            body[key] = [1, v] if key in ("prompt", "stop_token_ids") else v
        elif how == "float":
            body[draw(st.sampled_from(FLOAT_FIELDS))] = draw(non_finite)
        else:
            key = draw(st.sampled_from(MUTABLE))
            msgs = body.get("messages")
            if key in REQUIRED[path] and draw(st.booleans()):
                body.pop(key, None)
            elif key == "messages" and isinstance(msgs, list) and msgs and draw(st.booleans()):
                i = draw(st.integers(0, len(msgs) - 1))
                field = draw(st.sampled_from(["role", "content", "name"]))
                msgs[i] = {**(msgs[i] if isinstance(msgs[i], dict) else {}), field: draw(bad)}
            else:
                body[key] = draw(bad)
    return body


@pytest.fixture(scope="module")
def server():
    # A short context keeps the chat default (up to the context length) small for the fake's token plan.
    srv = start(max_context_len=64)
    yield srv
    srv.close()


def _exchange(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes, str | None]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, data, resp.getheader("connection")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(sorted(REQUIRED)), data=st.data())
def test_no_input_gives_a_5xx_and_the_connection_stays_usable(server, path, data):
    kind = data.draw(st.sampled_from(["schema"] * 8 + ["junk", "bytes"]))
    if kind == "schema":
        raw = json.dumps(data.draw(bodies(path))).encode()  # NaN/Infinity as Python writes them, as clients may
    elif kind == "junk":
        raw = json.dumps(data.draw(junk)).encode()
    else:
        raw = data.draw(st.binary(max_size=40))
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        status, payload, connection = _exchange(conn, path, raw)
        assert status < 500, (raw, status, payload)
        event(f"{kind}: HTTP {status} {json.loads(payload)['error']['param'] if status >= 400 else ''}")
        if status >= 400:
            err = json.loads(payload)["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], payload
        assert connection != "close" and conn.sock is not None, "the server closed the keep-alive connection"
        sock = conn.sock
        status, payload, _ = _exchange(conn, "/v1/completions", VALID)
        assert conn.sock is sock, "the follow-up request needed a new connection"
        assert status == 200 and json.loads(payload)["usage"]["completion_tokens"] == 2, payload
    finally:
        conn.close()
