"""The OpenAI-compatible HTTP front-end (docs/openai-api.md); the launcher calls `serve_http`."""

from __future__ import annotations

from tokenrouter.runtime.frontend.app import create_app
from tokenrouter.runtime.frontend.serve import serve_http

__all__ = ["create_app", "serve_http"]
