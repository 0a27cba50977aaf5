"""End to end with the official `openai` client: a real `tokenrouter serve` on the tiny CPU pair (a learned R2R
router with random weights, calibrated to hop; deterministic at temperature 0, so a request's text is its own
reference), stop strings, chat content as text parts and logprobs, streamed and not.

References: the same request without the feature (stop strings, parts) gives the text to cut or to match;
for logprobs, at temperature 0 the committed token is the argmax of the logits of the model that wrote it, so
each token's logprob is the largest of its row's top k, whichever model wrote it (the engine's part).
"""

from __future__ import annotations

import math

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")


from served import Served, write_config

openai = pytest.importorskip("openai")  # the official client (dev extra); absent on the GPU image

PROMPT = [5, 17, 300, 42, 9, 77, 1000, 3]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai")
    srv = Served.start(tmp, write_config(tmp / "serve.yaml", "r2r", weights="random", hop_rate=0.4))
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model(served) -> str:
    return httpx.get(served.url + "/v1/models").json()["data"][0]["id"]


def _stop_in(text: str) -> str:
    """A stop string from the middle of `text` that is not all whitespace."""
    for a in range(len(text) // 2, len(text) - 3):
        if text[a : a + 3].strip():
            return text[a : a + 3]
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_cuts_the_output_streamed_and_not(client, model):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, **GREEDY)
    text = full.choices[0].text
    assert full.usage.completion_tokens == 24 and full.choices[0].finish_reason == "length"
    stop = _stop_in(text)
    want = text[: text.find(stop)]
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, stop=[stop], **GREEDY)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 24
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=24, stop=stop, stream=True,
                                            **GREEDY))  # fmt: skip
    so_far = ""
    for c in chunks:
        so_far += c.choices[0].text
        assert want.startswith(so_far)
    assert so_far == want and chunks[-1].choices[0].finish_reason == "stop"


def test_chat_content_parts_equal_the_joined_string(client, model):
    parts = [{"type": "text", "text": "tell me"}, {"type": "text", "text": "a story"}]
    a = client.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}], max_tokens=12,
                                       **GREEDY)  # fmt: skip
    b = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "tell me\na story"}],
                                       max_tokens=12, **GREEDY)  # fmt: skip
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}],
                                                 max_tokens=12, stream=True, **GREEDY))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == a.choices[0].message.content


def _check_greedy_row(logprob: float | None, top: list[float], k: int) -> None:
    assert logprob is not None and math.isfinite(logprob) and logprob <= 0.0, logprob
    assert len(top) == k and top == sorted(top, reverse=True)
    assert logprob == pytest.approx(top[0], abs=1e-4), "greedy: the committed token is its writer's argmax"
    assert sum(math.exp(v) for v in top) <= 1.0 + 1e-4


def test_completion_logprobs_streamed_and_not(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 16
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert tok in top and top[tok] == v  # the sampled token is among the alternatives
        _check_greedy_row(v, sorted(top.values(), reverse=True)[:3], 3)
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=16, logprobs=3, stream=True,
                                            **GREEDY))  # fmt: skip
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_logprobs_streamed_and_not_from_both_models(client, model, served):
    msgs = [{"role": "user", "content": "hello"}]
    kw = {"model": model, "messages": msgs, "max_tokens": 16, "logprobs": True, "top_logprobs": 2, **GREEDY}
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 16
    for c in content:
        _check_greedy_row(c.logprob, [t.logprob for t in c.top_logprobs], 2)
        assert c.token == c.top_logprobs[0].token and c.bytes == c.top_logprobs[0].bytes
    per_model = r.model_extra["tokenrouter"]["tokens_per_model"]
    assert all(n > 0 for n in per_model.values()), f"both models should write at hop rate 0.4: {per_model}"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [x.logprob for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([c.logprob for c in content], abs=1e-5)
    plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, **GREEDY)
    assert plain.choices[0].logprobs is None


def test_n_and_a_batch_of_prompts_answer_as_the_single_requests_do(client, model):
    """At temperature 0 each choice is its prompt's greedy answer; sampled with a seed, choice j is the single
    request with seed + j (the engine's noise is a function of seed, position and token, not of the batch)."""
    prompts = [PROMPT, PROMPT[::-1]]
    single = [client.completions.create(model=model, prompt=p, max_tokens=10, **GREEDY).choices[0].text
              for p in prompts]  # fmt: skip
    both = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=10, **GREEDY)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [single[0], single[0], single[1], single[1]]
    assert both.usage.prompt_tokens == 2 * len(PROMPT) and both.usage.completion_tokens == 40
    sampled = {"temperature": 1.0, "extra_body": {"ignore_eos": True}}
    ref = [client.completions.create(model=model, prompt=PROMPT, max_tokens=10, seed=11 + j, **sampled).choices[0].text
           for j in range(3)]  # fmt: skip
    three = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, seed=11, n=3, **sampled)
    assert [c.text for c in three.choices] == ref
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, seed=11, n=3, stream=True, **sampled)
    texts = ["", "", ""]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == ref
