"""The official `openai` client against the front-end (fake deployment, real HTTP): stop strings, chat content as
text parts and logprobs, streamed and not, parse into the SDK's types with the values the fake planned, and
a refused parameter is the SDK's `BadRequestError` naming it."""

from __future__ import annotations

import pytest
from fake_backend import NAMES, expected_logprobs, expected_output
from live_server import start

openai = pytest.importorskip("openai")  # the official client (dev extra); absent on the GPU image

MODEL = "+".join(NAMES)
PROMPT = [5, 9, 13]


@pytest.fixture(scope="module")
def srv():
    s = start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c


def test_completion_stop_and_logprobs(srv, client):
    tok = srv.tokenizer
    ids, _ = expected_output(PROMPT, 12)
    text = tok.decode(ids)
    stop = text[14:17]
    m = next(m for m in range(1, 13) if stop in tok.decode(ids[:m]))
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, stop=[stop], logprobs=2)
    ch = r.choices[0]
    assert ch.text == text[: text.find(stop)] and ch.finish_reason == "stop"
    assert r.usage.completion_tokens == m
    assert ch.logprobs.token_logprobs == [e.logprob for e in expected_logprobs(PROMPT, m, 2)]
    assert ch.logprobs.tokens == [tok.token_bytes(i).decode() for i in ids[:m]]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, stop=stop, logprobs=2,
                                            stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == ch.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert [x for c in chunks for x in c.choices[0].logprobs.token_logprobs] == ch.logprobs.token_logprobs


def test_chat_content_parts_stop_and_logprobs(srv, client):
    tok = srv.tokenizer
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]
    prompt = tok.encode_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello\nthere"}])
    ids, _ = expected_output(prompt, 10)
    text = tok.decode(ids)
    stop = text[8:11]
    m = next(m for m in range(1, 11) if stop in tok.decode(ids[:m]))
    kw = {"model": MODEL, "messages": msgs, "max_tokens": 10, "stop": stop, "logprobs": True, "top_logprobs": 3}
    r = client.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.message.content == text[: text.find(stop)] and ch.finish_reason == "stop"
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == m
    want = expected_logprobs(prompt, m, 3)
    assert [c.logprob for c in ch.logprobs.content] == [e.logprob for e in want]
    assert [[t.logprob for t in c.top_logprobs] for c in ch.logprobs.content] == [[v for _, v in e.top] for e in want]
    assert [bytes(c.bytes) for c in ch.logprobs.content] == [tok.token_bytes(i) for i in ids[:m]]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ch.message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    streamed = [x.logprob for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert streamed == [e.logprob for e in want]


def test_refused_parameter_is_a_bad_request_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], presence_penalty=1.0)
    assert e.value.param == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[1, 2], seed=2**64 - 1)
    assert e.value.param == "seed"


def test_include_usage_sends_a_usage_chunk_with_empty_choices(client):
    """OpenAI's `stream_options.include_usage`: the last chunk before [DONE] has no choices and the request's
    usage (what clients such as vLLM's benchmark read it from); without it no such chunk is sent."""
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert chunks[-2].choices[0].finish_reason == "length"
    assert all(c.choices for c in chunks[:-1])
    plain = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, stream=True))
    assert all(c.choices for c in plain)
    msgs = [{"role": "user", "content": "hello"}]
    whole_chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5)
    chat = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, stream=True,
                                               stream_options={"include_usage": True}))  # fmt: skip
    assert chat[-1].choices == [] and chat[-1].usage == whole_chat.usage
    assert "".join(c.choices[0].delta.content or "" for c in chat[:-1]) == whole_chat.choices[0].message.content


def test_models_retrieve(client):
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve(NAMES[1]).id == NAMES[1]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"
