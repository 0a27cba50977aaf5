"""Request bodies of the OpenAI endpoints (pydantic, so `/openapi.json` documents them).

Only what the server acts on is declared; unknown fields are accepted and ignored, as OpenAI clients send
many optional ones. Semantic checks that need the deployment (vocabulary, KV capacity, model names) happen
in `params.py`, not here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = Field(False, description="TokenRouter extension: keep generating past end-of-sequence.")


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="Text or token ids (a batch of one is accepted; larger batches are not)."
    )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
