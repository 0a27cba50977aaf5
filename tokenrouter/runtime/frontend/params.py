"""From a validated OpenAI body to the wire: prompt token ids and `protocol.Sampling`, with every check that
needs the deployment. Each failure is an `APIError(400)` naming the field, raised before anything is sent,
so a bad request never reaches a subserver.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.frontend.errors import APIError
from tokenrouter.runtime.frontend.schemas import ChatRequest, CompletionRequest


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request must fit: ids below `vocab_size`; prompt + output within `max_context_len` and within
    every model's KV pool (`kv_capacity_tokens` is the minimum over the models)."""

    vocab_size: int
    kv_capacity_tokens: int
    max_context_len: int


def completion_prompt(req: CompletionRequest, encode) -> list[int]:
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], str | list):
        if len(p) != 1:
            raise APIError(400, "batched prompts are not supported: send one prompt per request", "prompt")
        p = p[0]
    if not isinstance(p, str):
        return list(p)
    try:
        return encode(p)
    except ValueError as e:  # e.g. a deployment without a tokenizer (dummy weights): ids only
        raise APIError(400, str(e), "prompt") from None


def chat_prompt(req: ChatRequest, tokenizer) -> list[int]:
    if not req.messages:
        raise APIError(400, "messages must not be empty", "messages")
    try:
        return tokenizer.encode_chat([m.model_dump() for m in req.messages])
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None


def sampling(req: CompletionRequest | ChatRequest, ids: list[int], lim: Limits, default_max: int | None) -> P.Sampling:
    """Check the prompt and the sampling fields; `default_max` None means "up to the context length"."""
    if req.n != 1:
        raise APIError(400, f"only n=1 is supported, got n={req.n}", "n")
    if not ids:
        raise APIError(400, "the prompt is empty", "prompt")
    bad = next((t for t in ids if not 0 <= t < lim.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {lim.vocab_size})", "prompt")
    if len(ids) >= lim.kv_capacity_tokens:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; the KV capacity is {lim.kv_capacity_tokens} tokens "
            "(the smallest over the models)",
            "prompt",
            "context_length_exceeded",
        )
    # A request that cannot fit a model's whole KV pool could never finish there: the smaller bound wins.
    context = min(lim.max_context_len, lim.kv_capacity_tokens)
    room = context - len(ids)
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    if max_tokens <= 0:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if len(ids) + max_tokens > context:
        raise APIError(
            400,
            f"prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds {context} tokens (the context length "
            f"{lim.max_context_len} or the smallest KV capacity {lim.kv_capacity_tokens})",
            "max_tokens",
            "context_length_exceeded",
        )
    if req.temperature < 0:
        raise APIError(400, f"temperature must be >= 0, got {req.temperature}", "temperature")
    if not 0 < req.top_p <= 1:
        raise APIError(400, f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_k == 0 or req.top_k < -1:
        raise APIError(400, f"top_k must be -1 (off) or >= 1, got {req.top_k}", "top_k")
    if req.stop:
        raise APIError(400, "stop strings are not supported; use stop_token_ids", "stop")
    stops = tuple(req.stop_token_ids or ())
    if any(not 0 <= t < lim.vocab_size for t in stops):
        raise APIError(400, "stop_token_ids must be ids of the vocabulary", "stop_token_ids")
    return P.Sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        max_tokens=max_tokens,
        stop_token_ids=stops,
        ignore_eos=req.ignore_eos,
    )
