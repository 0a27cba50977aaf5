"""Tokenizers for serving (extra `serve`: `tokenizers`): the bundled `tiny` tokenizer, the one a bundled model's
config names (`tokenizer` field), or a model directory's `tokenizer.json` and `tokenizer_config.json`. Chat prompts
are rendered in Python in the Qwen format (`<|im_start|>role\\ncontent<|im_end|>\\n`, then
`<|im_start|>assistant\\n`); a directory whose template is something else is refused for chat (`chat_format`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def _byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of byte-level BPE vocabularies (printable Latin-1 bytes stand for themselves)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    code = {b: b for b in printable}
    rest = (b for b in range(256) if b not in code)
    code.update({b: 0x100 + k for k, b in enumerate(rest)})
    return {chr(c): b for b, c in code.items()}


_BYTE_OF = _byte_level_alphabet()


@dataclass(slots=True)
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus stop tokens and the chat format. `eos_token_ids` are ids of this vocabulary;
    `vocab_size` (special tokens included) must not exceed the model's embedding rows."""

    tokenizer: Tokenizer
    eos_token: str
    eos_token_ids: tuple[int, ...]
    chat_template: str | None = None
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    byte_level: bool = field(init=False)
    special_ids: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        self.byte_level = isinstance(self.tokenizer.decoder, decoders.ByteLevel)
        self.special_ids = frozenset(self.tokenizer.get_added_tokens_decoder())

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def chat_format(self) -> str | None:
        """ "chatml" when the template is the Qwen/ChatML format this module renders, else None."""
        t = self.chat_template or ""
        return "chatml" if IM_START in t and IM_END in t else None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special-token strings become their ids); ValueError for a lone surrogate. Through
        `encode_batch`, which releases the GIL, so a long prompt does not stall the serving thread."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
                             f"{e.start}") from None  # fmt: skip
        return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (with a byte-level BPE possibly part of a UTF-8 character)."""
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self.byte_level and token_id not in self.special_ids and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode()

    def render_chat(self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text of a chat: one ChatML block per message, then the assistant header."""
        if self.chat_format != "chatml":
            raise ValueError(f"tokenizer {self.name!r} has no ChatML chat template; chat prompts are unsupported")
        parts = []
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise ValueError("every chat message needs string 'role' and 'content'")
            parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)

    def encode_chat(self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def bundled_tokenizer_names() -> list[str]:
    root = resources.files("tokenrouter.models").joinpath("tokenizers")
    return sorted(p.name for p in root.iterdir() if p.joinpath("tokenizer.json").is_file())


def load_tokenizer(name_or_path: str | Path) -> TextTokenizer:
    """A bundled tokenizer (`tiny`), a bundled model whose config names one, or a directory with `tokenizer.json`."""
    p = Path(name_or_path)
    if p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise ValueError(f"{p} has no tokenizer.json")
        return _load_dir(p, p.name)
    key = str(name_or_path).lower().split("/")[-1]
    tok_name = key if key in bundled_tokenizer_names() else _tokenizer_of_model(key)
    if tok_name is None:
        raise ValueError(
            f"no tokenizer for {str(name_or_path)!r}: bundled tokenizers are {', '.join(bundled_tokenizer_names())}"
            " (and the models whose config names one); otherwise pass a directory with tokenizer.json"
        )
    with resources.as_file(resources.files("tokenrouter.models").joinpath("tokenizers", tok_name)) as d:
        return _load_dir(Path(d), tok_name)


def _tokenizer_of_model(key: str) -> str | None:
    cfg = resources.files("tokenrouter.models").joinpath("configs", f"{key}.json")
    if not cfg.is_file():
        return None
    name = json.loads(cfg.read_text()).get("tokenizer")
    return name if name in bundled_tokenizer_names() else None


def _load_dir(d: Path, name: str) -> TextTokenizer:
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    cfg_file = d / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    eos = cfg.get("eos_token")
    if isinstance(eos, dict):  # older HF configs store AddedToken dicts
        eos = eos.get("content")
    eos_ids = []
    for t in (eos, IM_END, "<|endoftext|>"):
        i = tok.token_to_id(t) if isinstance(t, str) else None
        if i is not None and i not in eos_ids:
            eos_ids.append(i)
    if not eos_ids:
        raise ValueError(f"tokenizer in {d} names no end-of-sequence token it knows")
    template = cfg.get("chat_template")
    return TextTokenizer(tok, eos if isinstance(eos, str) else "", tuple(eos_ids), template, name, cfg)
