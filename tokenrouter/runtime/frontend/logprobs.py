"""Token log-probabilities in OpenAI's completion and chat shapes (docs/openai-api.md): a token's text is its
UTF-8 bytes (`\\xNN` for a partial character), an unknown logprob is null, and one below -9999 (or -inf) is
-9999.0 (JSON has no infinity)."""

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
        """The `logprobs` object of a choice; `offsets[i]`: where token i's text starts (completions only)."""
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
