"""Helpers: a real uvicorn serving the front-end on a free port, in a thread, against the fake deployment."""

from __future__ import annotations

import threading
import time

import uvicorn
from fake_backend import FakeDeployment

from tokenrouter.models import load_tokenizer
from tokenrouter.runtime.frontend import create_app


class LiveServer:
    def __init__(self, fake: FakeDeployment, api_key: str | None = None, heartbeat_timeout_s: float = 10.0) -> None:
        self.fake = fake
        self.tokenizer = load_tokenizer("tiny")
        self.app = create_app(fake, self.tokenizer, api_key=api_key, heartbeat_timeout_s=heartbeat_timeout_s)
        cfg = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + 5
        while httpx.get(self.url + "/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("fake deployment never became healthy")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.fake.close()


def start(**kw) -> LiveServer:
    fake_kw = {k: kw.pop(k) for k in list(kw) if k in ("capacity", "max_context_len", "token_delay_s")}
    srv = LiveServer(FakeDeployment(**fake_kw), **kw)
    srv.wait_healthy()
    return srv
