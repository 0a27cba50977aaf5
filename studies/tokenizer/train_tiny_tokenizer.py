"""Train the bundled `tiny` tokenizer (byte-level BPE) shared by the `tiny-small` / `tiny-large` models.

Run once from the repository root; it rewrites `tokenrouter/models/tokenizers/tiny/`:

    python studies/tokenizer/train_tiny_tokenizer.py

The training text is generated here from a seeded grammar (plain English-like sentences, numbers, code-ish
lines, a few accented / CJK / emoji words so multi-byte characters appear as several tokens), so the file is
reproducible without any download. The vocabulary is exactly `VOCAB_SIZE` (the tiny configs' `vocab_size`):
three special tokens first, the 256 byte symbols, then merges.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 1024
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
OUT = Path(__file__).resolve().parents[2] / "tokenrouter" / "models" / "tokenizers" / "tiny"

# Qwen-style chat: every message is `<|im_start|>role\ncontent<|im_end|>\n`; generation starts after
# `<|im_start|>assistant\n`. The runtime renders the same format in Python (tokenrouter.models.tokenizer).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SUBJECTS = [
    "the router",
    "a small model",
    "the large model",
    "every request",
    "the scheduler",
    "our team",
    "the engine",
    "a user",
    "the cache",
    "this batch",
    "the token",
    "my friend",
    "the teacher",
]
VERBS = [
    "sends",
    "reads",
    "writes",
    "keeps",
    "drops",
    "moves",
    "checks",
    "returns",
    "counts",
    "builds",
    "decodes",
    "routes",
    "waits for",
    "finishes",
    "explains",
    "compares",
    "likes",
    "finds",
]
OBJECTS = [
    "the next token",
    "a long answer",
    "its pages",
    "the prompt",
    "one question",
    "a short story",
    "the hidden state",
    "three numbers",
    "the first line",
    "a warm cup of tea",
    "the results",
    "every step",
    "a simple plan",
    "the river",
    "the weather report",
]
TAILS = [
    "today",
    "again",
    "before noon",
    "in order",
    "without waiting",
    "very quickly",
    "on the GPU",
    "after the hop",
    "when it is ready",
    "for the user",
    "at home",
    "in the morning",
]
QUESTIONS = [
    "What is the capital of France?",
    "How many tokens did you write?",
    "Can you explain routing?",
    "Why is the sky blue?",
    "Write a haiku about rain.",
    "What time is it in Tokyo?",
    "Please summarize the paper.",
    "How do I sort a list in Python?",
]
UNICODE = [
    "café",
    "naïve",
    "Zürich",
    "über",
    "señor",
    "东京",
    "日本語",
    "你好",
    "世界",
    "😀",
    "🚀",
    "✓",
    "π ≈ 3.14",
    "°C",
    "€5",
]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "x = [1, 2, 3]\n",
    'if __name__ == "__main__":\n    main()\n',
    '{"key": "value", "n": 42}\n',
]


def sentence(rng: random.Random) -> str:
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
    if rng.random() < 0.2:
        s += f" with {rng.randint(0, 9999)} items"
    if rng.random() < 0.15:
        s += f" near {rng.choice(UNICODE)}"
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!", "?"])


def corpus(seed: int = 0, paragraphs: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(paragraphs):
        r = rng.random()
        if r < 0.6:
            out.append(" ".join(sentence(rng) for _ in range(rng.randint(1, 5))))
        elif r < 0.8:
            q = rng.choice(QUESTIONS)
            a = " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))
            out.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n")
        elif r < 0.9:
            out.append(rng.choice(CODE))
        else:
            out.append(" ".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 6))))
    return out


def train(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"trained vocabulary has {tok.get_vocab_size()} entries, wanted {vocab_size}")
    return tok


def main() -> int:
    tok = train()
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} (vocab {tok.get_vocab_size()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
