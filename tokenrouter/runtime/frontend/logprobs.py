"""Token log-probabilities in OpenAI's two shapes, from the `TokenLogprobs` the subservers send per token.

- `/v1/completions` (`logprobs: k`, 0..5): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
  list entry per token; `top_logprobs[i]` maps token text -> logprob for the k most likely tokens plus the
  sampled one (so up to k + 1 entries; tokens with the same text collapse, as the shape implies).
- `/v1/chat/completions` (`logprobs: true`, `top_logprobs: k`, 0..20): `{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...k]}]}`.

A token's text is its bytes decoded as UTF-8, with bytes that do not form a whole character written as `\\xNN`
(a byte-level BPE splits characters over tokens); `bytes` holds the exact bytes. A logprob the server could not
know (a router committed a token outside the engine's top k) is null, with no alternatives. A logprob below
-9999 (or -inf) is written as -9999.0: JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from tokenrouter.core.batch import TokenLogprobs

_FLOOR = -9999.0


def _value(lp: float) -> float | None:
    return None if math.isnan(lp) else max(lp, _FLOOR)


class TokenBytes(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...


class LogprobFormatter:
    """Formats the logprobs of a run of output tokens; one per request (it caches token texts)."""

    def __init__(self, tokenizer: TokenBytes, chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self._text: dict[int, tuple[str, list[int]]] = {}

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._text.get(token_id)
        if hit is None:
            raw = self.tokenizer.token_bytes(token_id)
            hit = self._text[token_id] = (raw.decode("utf-8", errors="backslashreplace"), list(raw))
        return hit

    def format(self, ids: Sequence[int], entries: Sequence[TokenLogprobs | None], offsets: Sequence[int]) -> dict:
        """The `logprobs` object of a choice for these tokens; `offsets[i]` is where token i's text starts in
        the choice's text (completions only)."""
        if self.chat:
            return {"content": [self._chat_entry(t, e) for t, e in zip(ids, entries, strict=True)]}
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, e, off in zip(ids, entries, offsets, strict=True):
            text = self._token(t)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(None if e is None else _value(e.logprob))
            top: dict[str, float] = {}
            if e is not None:
                for alt, lp in e.top:
                    top.setdefault(self._token(alt)[0], _value(lp))
                top.setdefault(text, _value(e.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(off)
        return out

    def _chat_entry(self, token_id: int, e: TokenLogprobs | None) -> dict[str, Any]:
        text, raw = self._token(token_id)
        top = []
        for alt, lp in e.top if e is not None else ():
            alt_text, alt_raw = self._token(alt)
            top.append({"token": alt_text, "logprob": _value(lp), "bytes": alt_raw})
        return {"token": text, "logprob": None if e is None else _value(e.logprob), "bytes": raw, "top_logprobs": top}
