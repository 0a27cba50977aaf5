"""`serve_http`: the launcher's call to run the front-end (blocking), with a graceful shutdown (docs/runtime.md,
"Stopping"): the listener stays open while draining, and nothing is cancelled mid-write."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn

from tokenrouter.runtime.frontend.app import create_app, served_model_name
from tokenrouter.runtime.frontend.backend import Backend
from tokenrouter.runtime.frontend.handle import ServerHandle

log = logging.getLogger(__name__)

# A stopping subserver fails what it held: its streams end within moments, so the drain waits only this long.
FATAL_GRACE_S = 1.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains the backend before it stops. `request_stop` may be called from any thread; the
    event loop's tick starts the drain and sets `should_exit` once it is over."""

    def __init__(self, config: uvicorn.Config, backend: Backend, shutdown_timeout_s: float,
                 ready_line: str | None = None, t0: float | None = None) -> None:  # fmt: skip
        super().__init__(config)
        self.backend, self.shutdown_timeout_s, self.ready_line, self.t0 = backend, shutdown_timeout_s, ready_line, t0
        self._request: tuple[float, str] | None = None  # (grace seconds, why)
        self._drain: asyncio.Task | None = None

    def request_stop(self, why: str, grace_s: float) -> None:
        if self._request is None:
            self._request = (grace_s, why)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Replaces uvicorn's: the process exits 0, and the first signal drains instead of closing the listener.
        if self._request is None:
            self.request_stop(signal.Signals(sig).name, self.shutdown_timeout_s)
        else:
            self.backend.drain_deadline = 0.0  # a second signal: end what still runs now
            if self._drain is None:
                self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._request is not None and self._drain is None:
            grace, why = self._request
            log.info("%s: shutting down: new requests get 503; %d running get up to %.0f s to finish", why,
                     len(self.backend.streams), grace)  # fmt: skip
            self._drain = asyncio.create_task(self.backend.drain(grace))
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.ready_line is not None:
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else self.config.port
            took = f" (ready in {time.monotonic() - self.t0:.1f} s)" if self.t0 is not None else ""
            log.info("%s at http://%s:%d%s", self.ready_line, self.config.host, port, took)


def serve_http(server: ServerHandle, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               tokenizer, heartbeat_timeout_s: float = 10.0, shutdown_timeout_s: float = 30.0, access_log: bool = True,
               t0: float | None = None, admin_key: str | None = None) -> None:  # fmt: skip
    """Serve the OpenAI API until SIGINT/SIGTERM or until the launcher gives up, then `server.stop()` (always, once).
    `api_key` None leaves the API open; `t0`: when the server started (monotonic), for the ready line."""
    app = create_app(server, tokenizer, api_key=api_key, heartbeat_timeout_s=heartbeat_timeout_s,
                     access_log=access_log, admin_key=admin_key)  # fmt: skip
    # The CLI configured logging; uvicorn's access log is off in favour of ours (`frontend.access`).
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5)  # fmt: skip
    uv = DrainingServer(config, app.state.backend, shutdown_timeout_s,
                        ready_line=f"serving {served_model_name(server)}", t0=t0)  # fmt: skip
    if hasattr(server, "add_fatal_listener"):  # the launcher's Server; test fakes may not have it
        server.add_fatal_listener(lambda why: uv.request_stop(why, FATAL_GRACE_S))
    try:
        uv.run()
    finally:
        server.stop()
