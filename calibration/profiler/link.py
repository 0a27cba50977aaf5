"""The cross-host link as the runtime uses it (ZeroMQ over tcp): `tokenrouter link-probe` runs `serve_probe` on the
other host, `tokenrouter calibrate --link` runs `measure_link` here and `apply_link` writes the result into a
profile (docs/cluster.md, Measuring the link).
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from typing import Any

from tokenrouter.calibration.profiler.runtime_costs import PAYLOAD

ECHO, BULK, ACK = b"e", b"b", b"a"


def probe_address(text: str) -> tuple[str, str]:
    """`HOST:PORT`, `:PORT` or `tcp://HOST:PORT` -> (bind address, connect address); ValueError otherwise."""
    t = text[len("tcp://") :] if text.startswith("tcp://") else text
    host, sep, port = t.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65_536:
        raise ValueError(f"expected HOST:PORT or :PORT, got {text!r}")
    return f"tcp://{host or '*'}:{port}", f"tcp://{host or '127.0.0.1'}:{port}"


def serve_probe(listen: str, *, stop: Any = None, on_ready: Any = None) -> None:
    """Echo ECHO frames, acknowledge BULK frames with their size, until `stop()` is true (checked every 200 ms;
    None: forever). `on_ready(endpoint)` once bound."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(listen)
    if on_ready is not None:
        on_ready(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        while stop is None or not stop():
            if not sock.poll(200):
                continue
            peer, kind, payload = sock.recv_multipart(copy=False)
            if kind.bytes == ECHO:
                sock.send_multipart([peer, ECHO, payload], copy=False)
            else:
                sock.send_multipart([peer, ACK, str(len(payload)).encode()])
    finally:
        sock.close()
        ctx.term()


def measure_link(address: str, *, small: int = 2000, bulk_bytes: int = 8 << 20, count: int = 16, window: int = 4,
                 rounds: int = 5, timeout_s: float = 10.0) -> dict[str, Any]:  # fmt: skip
    """Measure the link to a `serve_probe` at `address` (tcp://HOST:PORT). TimeoutError when it does not answer."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)

    def recv() -> list[bytes]:
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no link-probe answered at {address} within {timeout_s:.0f} s (start one there: "
                               "tokenrouter link-probe --listen :PORT)")  # fmt: skip
        return sock.recv_multipart()

    try:
        for _ in range(50):  # connect and warm up both ways
            sock.send_multipart([ECHO, PAYLOAD])
            recv()
        rtt = []
        for _ in range(small):
            t0 = time.perf_counter()
            sock.send_multipart([ECHO, PAYLOAD])
            recv()
            rtt.append(time.perf_counter() - t0)
        blob = b"\0" * bulk_bytes
        gbps = []
        for r in range(rounds + 1):  # the first round warms the buffers up and is not counted
            sent = acked = 0
            t0 = time.perf_counter()
            while acked < count:
                while sent < count and sent - acked < window:
                    sock.send_multipart([BULK, blob], copy=False)
                    sent += 1
                kind, size = recv()
                if kind != ACK or int(size) != bulk_bytes:
                    raise RuntimeError(f"{address} answered {kind!r} {size!r}: not a tokenrouter link-probe")
                acked += 1
            if r:
                gbps.append(count * bulk_bytes * 8 / (time.perf_counter() - t0) / 1e9)
    finally:
        sock.close()
        ctx.term()
    rtt_ms = sorted(x * 1e3 for x in rtt)
    return {"address": address, "latency_ms": statistics.median(rtt_ms) / 2, "rtt_ms_median": statistics.median(rtt_ms),
            "rtt_ms_p10": rtt_ms[len(rtt_ms) // 10], "rtt_ms_p90": rtt_ms[(len(rtt_ms) * 9) // 10],
            "small_messages": small, "small_bytes": len(PAYLOAD), "bandwidth_gbps": statistics.median(gbps),
            "bandwidth_gbps_rounds": gbps, "bulk_bytes": bulk_bytes, "bulk_messages": count,
            "measured": datetime.now().isoformat(timespec="seconds")}  # fmt: skip


def apply_link(profile: Any, result: dict[str, Any]) -> Any:
    """`profile` with `link` from `result` (`measure_link`) and the measurement in `notes["link"]`."""
    import msgspec

    from tokenrouter.calibration.profile import LinkInfo, Profile

    notes = dict(profile.notes)
    notes["link"] = {"source": "tr calibrate --link (ZeroMQ over tcp, one way = median round trip / 2)", **result}
    if isinstance(notes.get("not_measured"), str):
        notes["not_measured"] = notes["not_measured"].replace("link bandwidth, ", "")
    link = LinkInfo(latency_ms=round(result["latency_ms"], 6), bandwidth_gbps=round(result["bandwidth_gbps"], 4))
    out = msgspec.structs.replace(profile, link=link, notes=notes)
    return Profile.from_json(out.to_json(), source="<profile with a measured link>")  # validated like a loaded one
