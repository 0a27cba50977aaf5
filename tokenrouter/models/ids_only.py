"""`IdsOnlyTokenizer`: what dummy-weight models without a tokenizer serve with (as vLLM's `skip_tokenizer_init`):
token-id prompts and outputs only; text prompts and chat are refused with a clear error."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdsOnlyTokenizer:
    """The `TextTokenizer` surface the front-end uses; `decode` renders ` <id>` per token, no eos token."""

    vocab_size: int
    name: str = "ids-only"
    eos_token_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        raise ValueError("this deployment has no tokenizer (dummy weights): send the prompt as token ids")

    def encode_chat(self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        raise ValueError("this deployment has no tokenizer (dummy weights): chat needs one; use /v1/completions "
                         "with token ids")  # fmt: skip

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" {int(i)}" for i in ids)
