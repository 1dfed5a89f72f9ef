"""A blocking request/reply client for the CLI (status, scale, stop) and for address discovery."""

from __future__ import annotations

import os

import zmq

from prl_actors.protocol.codec import ProtocolError, decode, encode
from prl_actors.protocol.messages import Error, Message, Msg, new_id


class RequestFailed(Exception):
    """No (valid) reply: the message says why, for the user."""


def request(address: str, msg: Msg, timeout_s: float = 3.0, ctx: zmq.Context | None = None) -> Message:
    """Send `msg` to the actor bound at `address` and wait for the reply to it (or RequestFailed)."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, f"cli-{os.getpid()}-{new_id()}".encode())
    msg.sender = msg.sender or "cli"
    try:
        sock.connect(address)
        sock.send_multipart(encode(msg))
        if not sock.poll(int(timeout_s * 1000)):
            raise RequestFailed(f"no reply from {address} within {timeout_s:g}s (is the run up?)")
        try:
            reply, _ = decode(sock.recv_multipart())
        except ProtocolError as exc:
            raise RequestFailed(f"bad reply from {address}: {exc}") from None
        if isinstance(reply, Error):
            raise RequestFailed(f"{address} answered {reply.code}: {reply.detail}")
        return reply
    finally:
        sock.close(linger=0)
        if own:
            ctx.term()
