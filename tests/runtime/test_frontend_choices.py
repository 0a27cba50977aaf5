"""Several choices in one answer (`n` > 1, a batch of prompts) over real HTTP and ZeroMQ against the fake deployment:
one request per choice on the subservers, choices indexed prompt * n + j, usage counting each prompt once, streams
interleaving the choices, a rejected choice failing the answer and ending the others, a client leaving aborting all.

References come from the fake's token plan (`expected_output`) and the tokenizer, not from the server's answer."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fake_backend import HANG, NAMES, REJECT, expected_hops, expected_output
from live_server import start
from test_frontend_api import sse_events

from tokenrouter.runtime import protocol as P

MODEL = "+".join(NAMES)


@pytest.fixture(scope="module")
def srv():
    s = start()
    yield s
    s.close()


def _submits(srv, since: int) -> list[P.Submit]:
    return [m for m in srv.fake.received[since:] if isinstance(m, P.Submit)]


def _per_model(models: list[int]) -> dict[str, int]:
    return {NAMES[0]: models.count(0), NAMES[1]: models.count(1)}


def test_a_batch_of_prompts_times_n_is_one_request_per_choice(srv):
    prompts, n, k = [[5, 9, 13], [2, 4], [77]], 2, 7
    before = len(srv.fake.received)
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": prompts, "n": n, "max_tokens": k})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(len(prompts) * n))
    for c in body["choices"]:
        ids, models = expected_output(prompts[c["index"] // n], k)
        assert c["text"] == srv.tokenizer.decode(ids)
        assert c["finish_reason"] == "length"
        assert c["tokenrouter"] == {"hops": expected_hops(k), "tokens_per_model": _per_model(models)}
    prompt_tokens = sum(len(p) for p in prompts)  # once per prompt, not once per choice
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 6 * k,
                             "total_tokens": prompt_tokens + 6 * k}  # fmt: skip
    _, models = expected_output([0], k)
    assert body["tokenrouter"] == {"hops": 6 * expected_hops(k), "tokens_per_model":
                                   {name: 6 * v for name, v in _per_model(models).items()}}  # fmt: skip
    subs = _submits(srv, before)
    assert len(subs) == 6 and len({s.rid for s in subs}) == 6
    assert sorted(P.unpack_ids(s.prompt_ids) for s in subs) == sorted(p for p in prompts for _ in range(n))


def test_choice_j_samples_with_seed_plus_j_wrapped_to_int64(srv):
    top = 2**63 - 1
    before = len(srv.fake.received)
    r = httpx.post(srv.url + "/v1/completions",
                   json={"model": MODEL, "prompt": [3, 4], "n": 3, "max_tokens": 2, "seed": top - 1})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [s.sampling.seed for s in _submits(srv, before)] == [top - 1, top, -(2**63)]
    before = len(srv.fake.received)
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": [3, 4], "n": 2, "max_tokens": 2})
    assert r.status_code == 200
    assert [s.sampling.seed for s in _submits(srv, before)] == [None, None]  # each choice its own random draw


def test_chat_stream_with_n_interleaves_choices_and_ends_with_the_whole_usage(srv):
    tok, msgs, n, k = srv.tokenizer, [{"role": "user", "content": "hi there"}], 3, 9
    body = {"model": MODEL, "messages": msgs, "max_tokens": k, "n": n, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert len({c["id"] for c in events[:-1]}) == 1
    ids, models = expected_output(tok.encode_chat(msgs), k)
    for i in range(n):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert all("role" not in x["delta"] for x in mine[1:])
        assert "".join(x["delta"]["content"] for x in mine) == tok.decode(ids)
        assert [x["finish_reason"] for x in mine] == [None] * (len(mine) - 1) + ["length"]
    assert usage_chunk["choices"] == []
    p = len(tok.encode_chat(msgs))
    assert usage_chunk["usage"] == {"prompt_tokens": p, "completion_tokens": n * k, "total_tokens": p + n * k}
    assert usage_chunk["tokenrouter"]["tokens_per_model"] == {name: n * v for name, v in _per_model(models).items()}


def test_stop_strings_cut_each_choice(srv):
    prompt, n = [5, 9, 13], 2
    ids, _ = expected_output(prompt, 12)
    text = srv.tokenizer.decode(ids)
    stop = text[6:8]
    r = httpx.post(srv.url + "/v1/completions",
                   json={"model": MODEL, "prompt": prompt, "n": n, "max_tokens": 12, "stop": stop})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(c["text"], c["finish_reason"]) for c in body["choices"]] == [(text[: text.find(stop)], "stop")] * n
    assert body["tokenrouter"]["hops"] is None  # every choice ended by the front-end


def test_a_rejected_choice_fails_the_answer_and_aborts_the_others(srv):
    before = len(srv.fake.received)
    r = httpx.post(srv.url + "/v1/completions",
                   json={"model": MODEL, "prompt": [[3, 4], [REJECT, 1]], "max_tokens": 4, "seed": HANG})  # fmt: skip
    assert r.status_code == 400 and "rejected by the fake" in r.json()["error"]["message"]
    hung = _submits(srv, before)[0].rid  # the first choice hangs after one token: only an abort ends it
    deadline = time.monotonic() + 5
    while hung not in srv.fake.aborts() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hung in srv.fake.aborts()


def test_a_client_leaving_a_stream_aborts_every_choice(srv):
    before = len(srv.fake.received)
    body = {"model": MODEL, "prompt": [[3, 4], [6, 7]], "max_tokens": 50, "seed": HANG, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                assert json.loads(line[6:])["choices"][0]["text"] is not None
                break
    rids = {s.rid for s in _submits(srv, before)}
    assert len(rids) == 2  # both prompts' choices hang (n = 1: each keeps the seed)

    def settled() -> bool:
        gauge = "tokenrouter_http_requests_in_flight 0.0" in httpx.get(srv.url + "/metrics").text
        return rids <= set(srv.fake.aborts()) and gauge

    deadline = time.monotonic() + 5
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled()


@pytest.mark.parametrize("stream", [True, False])
def test_a_dead_subserver_fails_a_several_choice_answer_within_seconds(stream):
    own = start()  # this one dies
    try:
        body = {"model": MODEL, "prompt": [[3], [4]], "n": 2, "max_tokens": 50, "seed": HANG, "stream": stream}
        t0 = time.monotonic()
        if stream:
            with httpx.stream("POST", own.url + "/v1/completions", json=body, timeout=10) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                own.fake.die(1)
                rest = [ln for ln in lines if ln.startswith("data: ")]
            errors = [ln for ln in rest if '"error"' in ln]
            assert len(errors) == 1 and "tiny-large" in errors[0] and rest[-1] == "data: [DONE]"
        else:
            threading.Timer(0.5, own.fake.die, args=(1,)).start()  # while every choice waits on its hung stream
            r = httpx.post(own.url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 503 and "tiny-large" in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 5
        assert "tokenrouter_http_requests_in_flight 0.0" in httpx.get(own.url + "/metrics").text
    finally:
        own.close()
