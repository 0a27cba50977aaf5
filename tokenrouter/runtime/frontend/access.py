"""The access log: one line per generation request when it ends (`tokenrouter.access`; a stream that ends with an
error chunk logs the error's status, 499: the client went away); a 5xx is also a warning `--no-access-log` keeps."""

from __future__ import annotations

import logging
from dataclasses import dataclass

access_log = logging.getLogger("tokenrouter.access")
log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    rid: str
    status: int
    finish: str  # "stop" | "length" | "abort" | "error" | "rejected" | "aborted" (client gone) | "invalid"
    prompt_tokens: int
    output_tokens: int
    hops: int
    seconds: float
    message: str = ""

    def line(self) -> str:
        out = (f"rid={self.rid} status={self.status} finish={self.finish} prompt={self.prompt_tokens} "
               f"output={self.output_tokens} hops={self.hops} time={self.seconds:.2f}s")  # fmt: skip
        return f"{out} error={self.message!r}" if self.message else out


def record(entry: Entry, enabled: bool = True) -> None:
    if enabled:
        access_log.info("%s", entry.line())
    if entry.status >= 500:
        log.warning("request %s failed (%d): %s", entry.rid, entry.status, entry.message)
