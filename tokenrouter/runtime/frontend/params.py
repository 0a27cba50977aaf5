"""From a validated OpenAI body to the wire, with every check pydantic's types cannot say: each failure is an
`APIError(400)` naming the field, raised before anything is sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.errors import APIError
from tokenrouter.runtime.frontend.schemas import ChatRequest, CompletionRequest


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request must fit (`kv_capacity_tokens`: the smallest over the models)."""

    vocab_size: int
    kv_capacity_tokens: int
    max_context_len: int


# OpenAI (and vLLM) parameters that would change the output and are not implemented: accepted at these defaults,
# else a 400 rather than a silently different answer (an empty tuple: only null).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {"best_of": (1,), "echo": (False,), "suffix": ("",),
                                            "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0),
                                            "repetition_penalty": (1, 1.0), "logit_bias": ({},), "min_p": (0, 0.0),
                                            "min_tokens": (0,), "use_beam_search": (False,), "length_penalty": (1, 1.0),
                                            "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
                                            "prompt_logprobs": (), "truncate_prompt_tokens": (), "guided_json": (),
                                            "guided_regex": (), "guided_choice": (), "guided_grammar": (),
                                            "tools": ([],), "tool_choice": ("none",), "functions": ([],),
                                            "function_call": ("none",), "response_format": ({"type": "text"},),
                                            "prediction": (), "audio": (), "modalities": (["text"],),
                                            "reasoning_effort": (), "web_search_options": ()}  # fmt: skip


def refuse_unsupported(req: CompletionRequest | ChatRequest) -> None:
    for name, value in (req.model_extra or {}).items():
        defaults = _UNSUPPORTED.get(name)
        if defaults is None or value is None:
            continue
        # Types must match too: `False == 0` in Python, but `"echo": 0` is not the default of a boolean.
        if not any(type(value) is type(d) and value == d for d in defaults):
            allowed = " or ".join(repr(d) for d in defaults) or "null"
            raise APIError(400, f"{name} is not supported by this server (only {allowed} or omitted)", name)


MAX_CHOICES = 256  # prompts x n of one request: each is a request on the subservers


def check_n(req: CompletionRequest | ChatRequest) -> None:
    if req.n is not None and req.n > MAX_CHOICES:
        raise APIError(400, f"n must be at most {MAX_CHOICES}, got {req.n}", "n")


def completion_prompts(req: CompletionRequest, encode) -> list[list[int]]:
    """The prompt, or each prompt of a batch (a list of strings or of token-id lists), as token ids."""
    p = req.prompt
    batch = p if isinstance(p, list) and p and isinstance(p[0], str | list) else [p]
    check_n(req)
    if len(batch) * (req.n or 1) > MAX_CHOICES:
        raise APIError(400, f"{len(batch)} prompts x n = {req.n or 1} make more than {MAX_CHOICES} choices", "prompt")
    out = []
    for i, one in enumerate(batch):
        where = "prompt" if len(batch) == 1 else f"prompt.{i}"
        if not isinstance(one, str):
            out.append(list(one))
            continue
        try:
            out.append(encode(one))
        except ValueError as e:  # e.g. a deployment without a tokenizer (dummy weights): ids only
            raise APIError(400, str(e), where) from None
    return out


def chat_prompt(req: ChatRequest, tokenizer) -> list[int]:
    """The messages as (role, text) through the chat template: content parts joined, `developer` as `system`."""
    if not req.messages:
        raise APIError(400, "messages must not be empty", "messages")
    out = []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if m.role in ("tool", "function"):
            raise APIError(400, f"{where}.role: {m.role!r} messages need tools, which this server does not support",
                           f"{where}.role")  # fmt: skip
        for key in ("tool_calls", "function_call"):
            if (m.model_extra or {}).get(key):
                raise APIError(400, f"{where}.{key}: tool calls are not supported", f"{where}.{key}")
        out.append({"role": "system" if m.role == "developer" else m.role, "content": _content_text(m.content, where)})
    try:
        return tokenizer.encode_chat(out)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None


def _content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A message's text: a string, or a list of text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if content is None:
        raise APIError(400, f"{where}.content: a message needs content", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise APIError(400, f"{where}.content.{j}.type: only 'text' parts are supported, got {kind!r}",
                           f"{where}.content.{j}.type")  # fmt: skip
        text = part.get("text")
        if not isinstance(text, str):
            raise APIError(400, f"{where}.content.{j}.text: a text part needs a string 'text'",
                           f"{where}.content.{j}.text")  # fmt: skip
        texts.append(text)
    return "\n".join(texts)


def stop_strings(req: CompletionRequest | ChatRequest) -> tuple[str, ...]:
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if any(not s for s in stops):
        raise APIError(400, "stop strings must be non-empty", "stop")
    return tuple(dict.fromkeys(stops))


def logprobs(req: CompletionRequest | ChatRequest) -> int | None:
    """How many alternatives per token the engine returns; None: no logprobs."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def sampling(req: CompletionRequest | ChatRequest, ids: list[int], lim: Limits, default_max: int | None,
             where: str = "prompt") -> P.Sampling:  # fmt: skip
    """Check the prompt (`where`: its name in errors) and the sampling fields; `default_max` None means "up to the
    context length"."""
    refuse_unsupported(req)
    check_n(req)
    label = "the prompt" if where == "prompt" else f"prompt {where.removeprefix('prompt.')} of the batch"
    if not ids:
        raise APIError(400, f"{label} is empty", where)
    bad = next((t for t in ids if not 0 <= t < lim.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {lim.vocab_size})", where)
    if len(ids) >= lim.kv_capacity_tokens:
        raise APIError(400, f"{label} has {len(ids)} tokens; the KV capacity is {lim.kv_capacity_tokens} tokens "
                       "(the smallest over the models)", where, "context_length_exceeded")  # fmt: skip
    # A request that cannot fit a model's whole KV pool could never finish there: the smaller bound wins.
    context = min(lim.max_context_len, lim.kv_capacity_tokens)
    room = context - len(ids)
    field, max_tokens = "max_tokens", req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        field, max_tokens = "max_completion_tokens", req.max_completion_tokens
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    if len(ids) + max_tokens > context:
        raise APIError(400, f"{label} ({len(ids)}) + {field} ({max_tokens}) exceeds {context} tokens (the context "
                       f"length {lim.max_context_len} or the smallest KV capacity {lim.kv_capacity_tokens})", field,
                       "context_length_exceeded")  # fmt: skip
    top_k = -1 if req.top_k is None else req.top_k
    if top_k == 0:
        raise APIError(400, "top_k must be -1 (off) or >= 1, got 0", "top_k")
    stops = tuple(req.stop_token_ids or ())
    if any(t >= lim.vocab_size for t in stops):
        raise APIError(400, f"stop_token_ids must be ids of the vocabulary [0, {lim.vocab_size})", "stop_token_ids")
    return P.Sampling(temperature=1.0 if req.temperature is None else req.temperature,
                      top_p=1.0 if req.top_p is None else req.top_p, top_k=top_k, seed=req.seed, max_tokens=max_tokens,
                      stop_token_ids=stops, ignore_eos=bool(req.ignore_eos), logprobs=logprobs(req))  # fmt: skip


def choice_seed(seed: int | None, j: int) -> int | None:
    """Choice j of `n`: seed + j, wrapped to a signed 64-bit value (equal seeds give equal samples, so the n
    choices of a seeded request differ and repeat)."""
    if seed is None:
        return None
    return (seed + j + 2**63) % 2**64 - 2**63
