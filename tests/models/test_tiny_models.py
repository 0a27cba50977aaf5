"""The bundled tiny CPU models and their shared tokenizer: shapes agree, the engine runs them, text survives
encode/decode, chat renders as the Jinja template says, and streaming detokenization never splits a
character."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from tokenrouter.models import IncrementalDetokenizer, bundled_model_names, load_spec

tokenizers = pytest.importorskip("tokenizers")
from tokenrouter.models.tokenizer import IM_END, bundled_tokenizer_names, load_tokenizer  # noqa: E402

TINY = ("tiny-small", "tiny-large")
TEXTS = [
    "Hello world. The router sends the next token again!",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "Zürich café naïve 东京 日本語 🚀 π ≈ 3.14 €5",
    "猫が好きです。 Ελληνικά и русский 🧪🦀",  # mostly characters the training text never had: byte tokens
    "def add(a, b):\n    return a + b\n",
]


def test_tiny_models_are_bundled_and_share_the_tokenizer():
    assert set(TINY) <= set(bundled_model_names())
    tok = load_tokenizer("tiny")
    assert "tiny" in bundled_tokenizer_names()
    small, large = (load_spec(n) for n in TINY)
    assert small.architecture == large.architecture == "Qwen3ForCausalLM"
    assert small.num_layers < large.num_layers and small.hidden_size < large.hidden_size
    for spec in (small, large):
        assert spec.vocab_size == tok.vocab_size
        assert spec.raw["eos_token_id"] == tok.tokenizer.token_to_id(IM_END) == tok.eos_token_ids[0]
        # a model name resolves to the same tokenizer file as the tokenizer name
        assert load_tokenizer(spec.name).tokenizer.to_str() == tok.tokenizer.to_str()


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(text):
    tok = load_tokenizer("tiny-small")
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert ids == tok.tokenizer.encode(text, add_special_tokens=False).ids  # the library's own single encode


def test_a_lone_surrogate_is_a_value_error():
    with pytest.raises(ValueError, match="lone surrogate"):
        load_tokenizer("tiny").encode("ab\ud800")


def test_encode_lets_other_threads_run():
    """The front-end tokenizes in a worker thread so that the event loop keeps serving; that only works if the
    tokenizer releases the GIL. The main thread counts 1 ms sleeps while a long text is encoded: it gets about
    one turn when the GIL is held throughout, hundreds when it is released."""
    tok = load_tokenizer("tiny")
    text = "".join(random.Random(0).choice("abcdefghij ") for _ in range(1_500_000))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (tok.encode(text), done.set()))
    turns = 0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        turns += 1
    worker.join()
    assert turns >= 20, turns


def test_special_tokens_are_single_ids_and_skipped_on_decode():
    tok = load_tokenizer("tiny")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    start, end = tok.tokenizer.token_to_id("<|im_start|>"), tok.tokenizer.token_to_id(IM_END)
    assert ids[0] == start and end in ids and ids.count(end) == 1
    assert tok.decode(ids) == "user\nhi\n"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_chat_render_matches_the_jinja_template():
    """Reference: transformers renders the shipped Jinja template of tokenizer_config.json."""
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer("tiny")
    d = Path(__file__).resolve().parents[2] / "tokenrouter" / "models" / "tokenizers" / "tiny"
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a city: café 东京?"},
        {"role": "assistant", "content": "Zürich."},
        {"role": "user", "content": "Another"},
    ]
    for gen in (True, False):
        ref = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        assert tok.render_chat(msgs, add_generation_prompt=gen) == ref
        assert tok.encode_chat(msgs, gen) == hf(ref, add_special_tokens=False)["input_ids"]
    assert tok.render_chat(msgs[:1], True).endswith("<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="role"):
        tok.render_chat([{"role": "user"}])


def test_tokenizer_config_names_eos_and_template():
    d = Path(__file__).resolve().parents[2] / "tokenrouter" / "models" / "tokenizers" / "tiny"
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == IM_END and "<|im_start|>" in cfg["chat_template"]
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer("qwen3-8b")  # bundled shape, no bundled tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenization_never_breaks_a_character(text):
    tok = load_tokenizer("tiny")
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok.decode)
    deltas = [detok.push([i]) for i in ids]
    tail = detok.flush()
    assert "".join(deltas) + tail == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas) and tail == ""


def test_incremental_detokenization_holds_back_a_split_character():
    tok = load_tokenizer("tiny")
    ids = tok.encode("a 猫")
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the test needs a character spread over several tokens"
    detok = IncrementalDetokenizer(tok.decode)
    out = [detok.push([i]) for i in ids]
    assert "" in out[1:] and "".join(out) == "a 猫"
    # a stream cut inside the character: flush releases what exists, as the plain decode does
    cut = IncrementalDetokenizer(tok.decode)
    released = "".join(cut.push([i]) for i in ids[:-1])
    assert released + cut.flush() == tok.decode(ids[:-1])


def test_incremental_detokenization_skips_special_tokens():
    tok = load_tokenizer("tiny")
    ids = tok.encode("ok<|im_end|>")
    detok = IncrementalDetokenizer(tok.decode)
    assert "".join(detok.push([i]) for i in ids) + detok.flush() == "ok"


@pytest.mark.parametrize("name", TINY)
def test_cpu_engine_runs_the_tiny_model(name):
    pytest.importorskip("torch")
    from tokenrouter.core.batch import Batch, BatchRow
    from tokenrouter.core.request import Request, SamplingParams
    from tokenrouter.engine import Engine, EngineConfig

    tok = load_tokenizer(name)
    eng = Engine(EngineConfig(model=name, load_format="dummy", device="cpu", num_pages=32))
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in TEXTS[:3]]
    reqs = [Request(f"r{i}", p, len(p), SamplingParams(max_tokens=4)) for i, p in enumerate(prompts)]
    batch = Batch(0, 0)
    for r in reqs:
        assert eng.kv_pool.grow(r.pages, r.num_tokens)
        batch.rows.append(BatchRow(r, 0, r.num_tokens))
    for step in range(4):
        out = eng.step(batch, return_hidden=True, return_logits=True).result()
        toks = out.next_token_ids.tolist()
        assert out.hidden.shape == (len(reqs), eng.spec.hidden_size)
        assert out.logits.shape == (len(reqs), tok.vocab_size)
        assert toks == out.logits.argmax(-1).tolist()  # greedy
        batch = Batch(0, step + 1)
        for r, t in zip(reqs, toks, strict=True):
            r.token_ids.append(t)
            assert eng.kv_pool.grow(r.pages, r.num_tokens)
            batch.rows.append(BatchRow(r, r.num_tokens - 1, 1))
    assert all(isinstance(tok.decode(r.token_ids[r.prompt_len :]), str) for r in reqs)
    eng.close()
