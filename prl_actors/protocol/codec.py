"""Encoding and validated decoding at the socket edge.

`decode` turns raw ZeroMQ frames into a typed message or raises `ProtocolError` with an
`ErrorCode`; nothing untyped travels past it. The header is checked first, so a peer speaking another
protocol version gets `bad_protocol` (not a confusing field error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from prl_actors.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, ErrorCode, Message, Msg

Frame = bytes | memoryview


class ProtocolError(Exception):
    """A frame that cannot become a typed message."""

    def __init__(self, code: ErrorCode, detail: str, reply_to: str = "", sender: str = "") -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.reply_to = reply_to
        self.sender = sender


class _Header(msgspec.Struct):
    proto: Any = None
    type: Any = None
    id: Any = ""
    sender: Any = ""


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Msg, payloads: Sequence[Frame] = ()) -> list[Frame]:
    """Frames for `msg`: the MessagePack map, then raw payload frames (sent without copying)."""
    return [_encoder.encode(msg), *payloads]


def decode(frames: Sequence[Frame]) -> tuple[Message, list[Frame]]:
    """(message, payload frames) or ProtocolError."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty multipart message")
    head = frames[0]
    try:
        header = _header_decoder.decode(head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"frame 0 is not a MessagePack map: {exc}") from None
    msg_id = header.id if isinstance(header.id, str) else ""
    sender = header.sender if isinstance(header.sender, str) else ""
    if header.proto != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.BAD_PROTOCOL,
            f"protocol version {header.proto!r} is not supported (this peer speaks {PROTOCOL_VERSION})",
            msg_id,
            sender,
        )
    if header.type not in MESSAGE_TYPES:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {header.type!r}", msg_id, sender)
    try:
        msg = _decoder.decode(head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"invalid {header.type!r} message: {exc}", msg_id, sender) from None
    return msg, list(frames[1:])
