"""`serve_http`: the one function the launcher calls to run the front-end (blocking)."""

from __future__ import annotations

import uvicorn

from tokenrouter.runtime.frontend.app import create_app
from tokenrouter.runtime.frontend.handle import ServerHandle


def serve_http(
    server: ServerHandle,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    tokenizer,
    heartbeat_timeout_s: float = 10.0,
    log_level: str = "warning",
) -> None:
    """Serve the OpenAI API for `server` until SIGINT/SIGTERM, then call `server.stop()` (always, once).

    Binds 127.0.0.1 unless `host` says otherwise; `api_key` None leaves the API open. `tokenizer` is a
    `tokenrouter.models.TextTokenizer`. The front-end binds its PULL at `server.addresses.frontend` when
    uvicorn starts; subservers may connect and send `Ready` before or after that (ZeroMQ queues).
    """
    app = create_app(server, tokenizer, api_key=api_key, heartbeat_timeout_s=heartbeat_timeout_s)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    finally:
        server.stop()
