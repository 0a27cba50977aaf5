"""Request bodies of the OpenAI endpoints (pydantic, so `/openapi.json` documents them): strict, nothing coerced,
unknown keys ignored (docs/openai-api.md, "Strict bodies"); deployment checks are in `params.py`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]

# The roles of OpenAI's chat API (`function` is its deprecated form of `tool`).
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = Field(
        None, description="Also send a last chunk with empty `choices` and the request's `usage` before [DONE]."
    )


class _Sampling(_Strict):
    model: str = Field(..., description="The served pair's name (see /v1/models) or one of its model names.")
    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = Field(
        None, description="vLLM extension: sample among the k most likely tokens; -1 (default) is off, 0 is refused."
    )
    seed: Int64 | None = Field(
        None, description="Signed 64-bit, as OpenAI's: [-2**63, 2**63 - 1]. Equal seeds give equal samples."
    )
    n: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = Field(
        None, description="Choices per prompt, each its own request (choice j samples with seed + j); <= 256 in all."
    )
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = Field(
        None, description="Up to 4 non-empty strings; the output ends before the first one that appears."
    )
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = None
    ignore_eos: bool | None = Field(None, description="TokenRouter extension: keep generating past end-of-sequence.")


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="Text or token ids, or a batch of either: one choice per prompt (times `n`)."
    )
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = Field(
        None, description="Log-probabilities of the sampled tokens and the top `logprobs` alternatives (0..5)."
    )


class ChatMessage(_Strict):
    role: Role
    # A string or a list of content parts ({"type": "text", "text": ...}); checked in `params.chat_prompt`.
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    logprobs: bool | None = Field(None, description="Return the sampled tokens' log-probabilities.")
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = Field(
        None, description="With logprobs: also the top `top_logprobs` alternatives per token (0..20)."
    )
