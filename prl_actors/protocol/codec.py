"""Encoding and validated, bounded decoding at the socket edge.

`decode` turns raw ZeroMQ frames into a typed message or raises `ProtocolError` with an
`ErrorCode`; nothing untyped travels past it, and nothing else escapes it: whatever bytes a peer sends,
the caller gets a message or a `ProtocolError` (a fuzz test holds it to that). A frame that fails is
then read as a bare header, so a peer speaking another protocol version gets `bad_protocol` (not a
confusing field error) and an unknown type `unknown_type`.

Limits (what one frame can cost the receiver):
- size: frame 0 at most `max_bytes` (the socket's ZMQ_MAXMSGSIZE already disconnects a peer that
  sends a bigger frame over tcp/ipc; this check covers inproc and callers without a socket);
- frames: frame 0 plus at most `PAYLOAD_FRAMES[type]` raw frames (`weight_chunk` has one), or, for a
  message with typed arrays (the env messages), one per array it describes, at most `MAX_ARRAYS`;
- shape: every field is typed, so a decoded message is never deeper than its schema (at most 5
  levels); values of unknown fields are skipped, not built, and msgspec refuses nesting beyond the
  interpreter's recursion limit (RecursionError, mapped to `malformed`); a container cannot hold
  more elements than its frame has bytes, so a decoded message costs a small multiple of its size;
- strings: must be valid UTF-8 (msgspec raises UnicodeDecodeError, mapped to `malformed`);
- length prefixes larger than the frame are `malformed` ("truncated"), never an allocation.
Peer-controlled text copied into an error (type tag, id, sender) is cut to `ECHO_CHARS`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from prl_actors.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, ErrorCode, Message, Msg, tag_of

Frame = bytes | memoryview

PAYLOAD_FRAMES = {"weight_chunk": 1}  # raw frames after frame 0, by type (every other type: none)
MAX_ARRAYS = 16  # raw frames of a message with `arrays` (a segment has 8)
ECHO_CHARS = 96  # how much peer-controlled text an error may carry back
# Every way msgspec (or a bad value inside it) can fail on hostile bytes: all mean `malformed`.
_DECODE_ERRORS = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    RecursionError,
    UnicodeDecodeError,
    ValueError,
    OverflowError,
    TypeError,
)


class ProtocolError(Exception):
    """A frame that cannot become a typed message."""

    def __init__(self, code: ErrorCode, detail: str, reply_to: str = "", sender: str = "") -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.reply_to = reply_to
        self.sender = sender


class _Header(msgspec.Struct):
    """The common header, read leniently: a wrong type here is not an error yet (see `_field`)."""

    proto: msgspec.Raw = msgspec.Raw(b"")
    type: msgspec.Raw = msgspec.Raw(b"")
    id: msgspec.Raw = msgspec.Raw(b"")
    sender: msgspec.Raw = msgspec.Raw(b"")


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)
_decoder = msgspec.msgpack.Decoder(Message)
_int = msgspec.msgpack.Decoder(int)
_str = msgspec.msgpack.Decoder(str)


def encode(msg: Msg, payloads: Sequence[Frame] = ()) -> list[Frame]:
    """Frames for `msg`: the MessagePack map, then raw payload frames (sent without copying)."""
    return [_encoder.encode(msg), *payloads]


def echo(value: object) -> str:
    """Peer-controlled text, cut short for logs and error replies."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "..."


def _field(raw: msgspec.Raw, decoder: msgspec.msgpack.Decoder[int] | msgspec.msgpack.Decoder[str]) -> object:
    """A header field's value, or None when it is absent or not of the expected type."""
    if not raw:
        return None
    try:
        return decoder.decode(raw)
    except _DECODE_ERRORS:
        return None


def decode(frames: Sequence[Frame], max_bytes: int = 0) -> tuple[Message, list[Frame]]:
    """(message, payload frames) or ProtocolError. `max_bytes` > 0 bounds frame 0. A well-formed
    message costs one typed decode; only a failure is analysed further, for its precise code."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty multipart message")
    head = frames[0]
    if max_bytes and len(head) > max_bytes:
        raise ProtocolError(ErrorCode.MALFORMED, f"frame 0 has {len(head)} bytes (limit {max_bytes})")
    try:
        msg: Message = _decoder.decode(head)
    except _DECODE_ERRORS as exc:
        raise _diagnose(head, exc) from None
    if msg.proto != PROTOCOL_VERSION:
        raise _bad_protocol(msg.proto, echo(msg.id), echo(msg.sender))
    if len(frames) > 1 and len(frames) - 1 > payload_frames(msg):
        detail = f"{tag_of(msg)!r} carries {len(frames) - 1} raw frames (at most {payload_frames(msg)})"
        raise ProtocolError(ErrorCode.MALFORMED, detail, echo(msg.id), echo(msg.sender))
    return msg, list(frames[1:])


def payload_frames(msg: Message) -> int:
    """How many raw frames may follow frame 0 of `msg`."""
    arrays = getattr(msg, "arrays", None)
    if isinstance(arrays, list):
        return min(len(arrays), MAX_ARRAYS)
    return PAYLOAD_FRAMES.get(tag_of(msg), 0)


def _bad_protocol(proto: object, msg_id: str, sender: str) -> ProtocolError:
    detail = f"protocol version {echo(proto)} is not supported (this peer speaks {PROTOCOL_VERSION})"
    return ProtocolError(ErrorCode.BAD_PROTOCOL, detail, msg_id, sender)


def _diagnose(head: Frame, exc: Exception) -> ProtocolError:
    """Why frame 0 is not a message: not a map, another protocol, an unknown type, or bad fields."""
    try:
        header = _header_decoder.decode(head)
    except _DECODE_ERRORS as err:
        return ProtocolError(ErrorCode.MALFORMED, f"frame 0 is not a MessagePack map: {echo(str(err))}")
    msg_id, sender = _field(header.id, _str), _field(header.sender, _str)
    msg_id = echo(msg_id) if isinstance(msg_id, str) else ""
    sender = echo(sender) if isinstance(sender, str) else ""
    proto = _field(header.proto, _int)
    if proto != PROTOCOL_VERSION:
        return _bad_protocol(proto, msg_id, sender)
    tag = _field(header.type, _str)
    if tag not in MESSAGE_TYPES:
        return ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {echo(tag)}", msg_id, sender)
    return ProtocolError(ErrorCode.MALFORMED, f"invalid {tag!r} message: {echo(str(exc))}", msg_id, sender)
