"""Typed wire messages (MessagePack) and the validating codec. See docs/PROTOCOL.md."""

from prl_actors.protocol.codec import ProtocolError, decode, encode
from prl_actors.protocol.messages import *  # noqa: F403
from prl_actors.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Message, Msg, new_id

__all__ = ["MESSAGE_TYPES", "PROTOCOL_VERSION", "Message", "Msg", "ProtocolError", "decode", "encode", "new_id"]
