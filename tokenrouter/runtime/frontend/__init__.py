"""The OpenAI-compatible HTTP front-end: FastAPI routes, the ZeroMQ client of the subservers, metrics. The launcher
calls `serve_http(server, host=..., port=..., api_key=..., tokenizer=...)` with a `handle.ServerHandle`."""

from __future__ import annotations

from tokenrouter.runtime.frontend.app import create_app
from tokenrouter.runtime.frontend.serve import serve_http

__all__ = ["create_app", "serve_http"]
