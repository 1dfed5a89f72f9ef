"""A blocking request/reply client for the CLI (status, scale, stop) and for address discovery.

With `keys` (a run's key directory, or an exported copy) the client is a CURVE client that speaks
as `as_` (default `operator`: the only key `scale` and `stop` are accepted from); its routing id and
`sender` are "<as_>-<pid>-<n>", names that key covers. Without keys it is a plain client, which only
a run with `transport.auth: none` answers. A refused handshake is reported as such, not as silence.
"""

from __future__ import annotations

import itertools
import os

import zmq
from zmq.utils.monitor import recv_monitor_message

from prl_actors.protocol.codec import ProtocolError, decode, encode
from prl_actors.protocol.messages import Error, Message, Msg
from prl_actors.transport.auth import KeysError, KeyStore, Security

_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_counter = itertools.count()


class RequestFailed(Exception):
    """No (valid) reply: the message says why, for the user."""


def request(
    address: str,
    msg: Msg,
    timeout_s: float = 3.0,
    ctx: zmq.SyncContext | None = None,
    keys: KeyStore | None = None,
    as_: str = "operator",
    server: str = "coordinator",
) -> Message:
    """Send `msg` to the actor `server` bound at `address` and wait for the reply to it (or RequestFailed)."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    name = f"{as_}-{os.getpid()}-{next(_counter)}"
    sock = ctx.socket(zmq.DEALER)
    monitor = sock.get_monitor_socket(_FAILED)
    try:
        _setup(sock, name, keys, server, as_)
        msg.sender = name
        sock.connect(address)
        sock.send_multipart(encode(msg))
        return _wait_reply(sock, monitor, address, timeout_s, keys)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        if own:
            ctx.term()


def _setup(sock: zmq.SyncSocket, name: str, keys: KeyStore | None, server: str, as_: str) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, name.encode())
    if keys is not None:
        try:
            Security(keys, as_).connect(sock, server)
        except KeysError as exc:
            raise RequestFailed(str(exc)) from None


def _wait_reply(
    sock: zmq.SyncSocket, monitor: zmq.SyncSocket, address: str, timeout_s: float, keys: KeyStore | None
) -> Message:
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    ready = dict(poller.poll(int(timeout_s * 1000)))
    if sock not in ready and monitor in ready:
        event = recv_monitor_message(monitor)
        how = "with keys from " + str(keys.directory) if keys else "without keys (this run needs them: --keys DIR)"
        kind = zmq.Event(event["event"]).name
        raise RequestFailed(f"{address} refused our handshake ({kind}) {how}; see docs/SECURITY.md")
    if sock not in ready:
        raise RequestFailed(f"no reply from {address} within {timeout_s:g}s (is the run up?)")
    try:
        reply, _ = decode(sock.recv_multipart())
    except ProtocolError as exc:
        raise RequestFailed(f"bad reply from {address}: {exc}") from None
    if isinstance(reply, Error):
        raise RequestFailed(f"{address} answered {reply.code}: {reply.detail}")
    return reply
