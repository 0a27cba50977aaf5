"""The front-end over real HTTP and real ZeroMQ against the fake deployment: answers, ordering, usage."""

from __future__ import annotations

import json

import httpx
from fake_backend import NAMES, expected_hops, expected_output

MODEL = "+".join(NAMES)


def sse_events(resp: httpx.Response) -> list[dict | str]:
    out: list[dict | str] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_whole_orders_tokens_and_reports_usage(live):
    prompt = [5, 9, 13]
    r = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    ids, models = expected_output(prompt, 12)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == live.tokenizer.decode(ids)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    assert body["tokenrouter"] == {
        "hops": expected_hops(12),
        "tokens_per_model": {NAMES[0]: models.count(0), NAMES[1]: models.count(1)},
    }


def test_completion_stream_is_in_position_order_and_ends_with_done(live):
    prompt = [1, 2, 3, 4]
    with httpx.stream(
        "POST", live.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 23, "stream": True}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids, models = expected_output(prompt, 23)
    assert "".join(c["choices"][0]["text"] for c in chunks) == live.tokenizer.decode(ids)
    got_models = [m for c in chunks[:-1] for m in c["tokenrouter"]["models"]]
    assert got_models == models  # in order, every position exactly once
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 23
    assert last["tokenrouter"]["hops"] == expected_hops(23)


def test_text_prompt_and_chat(live):
    tok = live.tokenizer
    r = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "hello world", "max_tokens": 4})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode("hello world"))
    msgs = [{"role": "user", "content": "hi there"}]
    r = httpx.post(live.url + "/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    ids, _ = expected_output(tok.encode_chat(msgs), 6)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": tok.decode(ids)}
    with httpx.stream(
        "POST",
        live.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": msgs, "max_tokens": 6, "stream": True},
    ) as r:
        events = sse_events(r)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[:-1]) == tok.decode(ids)


def test_models_openapi_and_health(live):
    r = httpx.get(live.url + "/v1/models")
    assert r.json()["data"][0]["id"] == MODEL
    assert "/v1/chat/completions" in httpx.get(live.url + "/openapi.json").json()["paths"]
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    head = httpx.head(live.url + "/health")
    assert head.status_code == 200 and head.content == b""


def test_metrics_come_from_stats(live):
    text = httpx.get(live.url + "/metrics").text
    for name in NAMES:
        assert f'tokenrouter_kv_pages_used{{model="{name}"}} 12.0' in text
        assert f'tokenrouter_requests_running{{model="{name}"}} 3.0' in text
        assert f'tokenrouter_requests_waiting{{model="{name}"}} 2.0' in text
        assert f'tokenrouter_tokens_total{{model="{name}"}} 150.0' in text
        assert f'tokenrouter_hops_total{{model="{name}"}} 9.0' in text
        assert f'tokenrouter_batch_size_mean{{model="{name}"}} 4.0' in text  # 160 rows / 40 steps
        assert f'tokenrouter_step_time_ms_mean{{model="{name}"}} 2.0' in text  # 80 ms / 40 steps
        assert f'tokenrouter_subserver_up{{model="{name}"}} 1.0' in text
        assert f'tokenrouter_loop_steps_total{{model="{name}"}} 30.0' in text
        assert f'tokenrouter_loop_seconds_total{{model="{name}"}} 0.066' in text
        assert f'tokenrouter_loop_gpu_seconds_total{{model="{name}"}} 0.06' in text
        assert f'tokenrouter_busy_seconds_total{{model="{name}"}} 0.07' in text
        assert f'tokenrouter_step_seconds_total{{model="{name}"}} 0.08' in text
