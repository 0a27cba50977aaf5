"""Wire format of peer messages: msgpack via msgspec, the encoding the runtime sends over ZeroMQ. A frame is
`[kind, payload]`; the kind names the dataclass the payload decodes into (msgspec decodes one type per union).
"""

from __future__ import annotations

import msgspec

from tokenrouter.core.messages import LiveCount, PeerMsg, PeerReq

_KINDS: dict[str, type[PeerReq] | type[LiveCount]] = {"req": PeerReq, "count": LiveCount}
_NAMES = {t: k for k, t in _KINDS.items()}
_encoder = msgspec.msgpack.Encoder()
_frame = msgspec.msgpack.Decoder(tuple[str, msgspec.Raw])
_decoders = {k: msgspec.msgpack.Decoder(t) for k, t in _KINDS.items()}


def encode(msg: PeerMsg) -> bytes:
    return _encoder.encode((_NAMES[type(msg)], msg))


def decode(data: bytes) -> PeerMsg:
    kind, raw = _frame.decode(data)
    dec = _decoders.get(kind)
    if dec is None:
        raise ValueError(f"unknown peer message kind {kind!r}")
    return dec.decode(raw)
