"""The access log: one line per generation request when it ends, on the `tokenrouter.access` logger, e.g.

    rid=3f2a... status=200 finish=length prompt=8 output=16 hops=3 time=0.84s

`status` is what the client saw: 200 for a finished request (a stream's HTTP status stays 200 even when it
ends with an error chunk, so then the error's status is logged), 499 when the client went away. A request that
ends with a server-side error (5xx) is also logged as a warning with its id on this module's logger, which
`--no-access-log` does not silence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

access_log = logging.getLogger("tokenrouter.access")
log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    """What the front-end knows of a request when it ends."""

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
