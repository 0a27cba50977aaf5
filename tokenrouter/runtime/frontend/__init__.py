"""The OpenAI-compatible HTTP front-end: FastAPI routes, the ZeroMQ client of the subservers, metrics.

The launcher calls `serve_http(server, host=..., port=..., api_key=..., tokenizer=...)` with a `ServerHandle`.
"""

from __future__ import annotations

from tokenrouter.runtime.frontend.app import create_app, served_model_name
from tokenrouter.runtime.frontend.handle import ServerHandle
from tokenrouter.runtime.frontend.serve import serve_http

__all__ = ["ServerHandle", "create_app", "serve_http", "served_model_name"]
