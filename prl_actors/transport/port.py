"""ZeroMQ behind a small interface: one `Port` per actor owns all of that actor's sockets.

Topology: an actor that serves others binds one ROUTER (`bind`); it reaches its peers through one
DEALER per peer (`peers`), whose routing id is "<actor name>#<64 random bits>": the name for the logs,
the random part so that no other peer can take over the connection by guessing its routing id (with
ROUTER_HANDOVER a newcomer with the same id would receive its replies). Logs show the name only.

Hazards, and what this module does about them:
- ZeroMQ sockets are not thread-safe. Only the port thread touches them; other threads hand frames
  over through `send`, which goes through an inproc PUSH/PULL outbox (one PUSH per calling thread).
- A ROUTER silently drops a message to an unknown routing id; `ROUTER_MANDATORY` makes that an error
  (EHOSTUNREACH) we log and count instead. `ROUTER_HANDOVER` lets a restarted peer with the same name
  take over.
- Queues are bounded (`Limits`): every socket has finite send and receive high-water marks. The port
  never blocks in send (NOBLOCK). Policy for a full queue (EAGAIN): the message is *parked* in the
  port, in order, per destination, and retried as the peer drains (a weight transfer larger than the
  high-water mark streams out this way; parked frames are views of the sender's buffers, not copies).
  A destination whose parked queue exceeds `max_parked` messages, or whose oldest parked message waits
  longer than `park_timeout_s`, is given up: its parked messages are dropped and reported once through
  `on_send_failed` (logged as `send_failed`). Nothing waits forever; the protocol's timeouts and retries
  (work requests, group acks, weight fetches) recover what was dropped. A peer that is gone
  (EHOSTUNREACH) is reported at once. On the receive side a full queue stops reading from that
  connection, which pushes back on the sender's own high-water mark; and while more than
  `max_backlog` messages wait in the actor's inbox (`backlog`), the port reads no peer socket at all,
  so a flood fills the sockets' bounded queues, never the process's memory.
- Sockets close with linger 0 in a `finally`, so a dead peer never keeps a process alive; a stop
  after `flush` (an actor's last messages: Shutdown, Leave) gives libzmq a bounded linger
  (`stop(linger_ms=...)`) to put what the port thread routed on the wire.
- Message size: every socket has ZMQ_MAXMSGSIZE (`Limits.max_msg_bytes`, or `bulk_msg_bytes` for the
  sockets that carry weight chunks), so a peer that sends a bigger frame is disconnected by ZeroMQ
  before the frame is buffered; frame 0 is checked against the same bound when decoded.
- Authentication (`security`, transport/auth.py): the ROUTER is a CURVE server, each DEALER a CURVE
  client of its peer. A message's `principal` is who sent it, as far as the transport can tell: the
  key name the ZAP handler put in the frames' "User-Id" (CURVE), else the routing id (no
  authentication: inproc, or `transport.auth: none`); on a DEALER it is the peer the socket connects
  to. Failed handshakes (no CURVE, unknown key, wrong server key) are seen on a socket monitor and
  reported through `on_auth_failed`, so they are counted and logged, not silent.
- The port thread never dies quietly: an exception escaping its loop is reported through
  `on_crash` (the actor host turns it into a crash of the actor: logged, non-zero exit).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import zmq
from zmq.utils.monitor import parse_monitor_message

from prl_actors.protocol.codec import Frame, ProtocolError, decode, encode
from prl_actors.protocol.messages import ErrorCode, Msg
from prl_actors.transport.auth import Security, pop_denial

_outbox_ids = itertools.count()
_flush_ids = itertools.count()
M_co = TypeVar("M_co", bound=Msg, covariant=True)


ROUTER = ""  # the bound socket's name in `Limits.bulk` and in auth-failure reports
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


@dataclass
class Inbound(Generic[M_co]):
    """A decoded message. `peer` is the DEALER peer name it came from, or None when it came in
    on the ROUTER, in which case `identity` is the sender's routing id (for replies). `principal`
    is the authenticated sender (see the module docstring); built by hand (tests, replay) it may be
    left empty, and then `who` falls back to the peer or the routing id."""

    msg: M_co
    payloads: list[Frame]
    peer: str | None = None
    identity: bytes = b""
    t_recv: float = 0.0
    principal: str = ""

    @property
    def who(self) -> str:
        return self.principal or self.peer or name_of_id(self.identity)


@dataclass
class BadFrame:
    error: ProtocolError
    peer: str | None
    identity: bytes


@dataclass(frozen=True)
class Limits:
    """Queue bounds of one port (see the module docstring for the policy when they are reached)."""

    hwm: int = 1000  # messages queued per socket and direction (ZeroMQ SNDHWM / RCVHWM)
    max_parked: int = 100_000  # messages parked per destination before it is given up
    park_timeout_s: float = 30.0  # the oldest parked message waits at most this long
    outbox_hwm: int = 100_000  # actor thread -> port thread handover queue
    max_msg_bytes: int = 0  # ZMQ_MAXMSGSIZE per frame of every socket (0 = unbounded)
    bulk_msg_bytes: int = 0  # ... of the sockets in `bulk`, which carry weight chunks
    bulk: frozenset[str] = frozenset()  # peer names, and ROUTER for the bound socket
    max_backlog: int = 10_000  # inbox items of the actor above which the port stops reading peers

    def max_bytes(self, socket_name: str) -> int:
        return self.bulk_msg_bytes if socket_name in self.bulk else self.max_msg_bytes


class Dest:
    """Where an outgoing message goes: `Dest.peer('coordinator')` or `Dest.reply(identity)`."""

    __slots__ = ("name", "identity")

    def __init__(self, name: str | None = None, identity: bytes = b"") -> None:
        self.name, self.identity = name, identity

    @classmethod
    def peer(cls, name: str) -> Dest:
        return cls(name=name)

    @classmethod
    def reply(cls, identity: bytes) -> Dest:
        return cls(identity=identity)

    def __repr__(self) -> str:
        return f"peer:{self.name}" if self.name else f"id:{name_of_id(self.identity)}"


def name_of_id(identity: bytes) -> str:
    """The actor name in a routing id ("worker-3#9f2c..." -> "worker-3")."""
    return identity.split(b"#", 1)[0].decode(errors="replace")


@dataclass
class _Parked:
    """Messages for one destination that met a full queue, oldest first."""

    sock: zmq.SyncSocket
    head: list[Frame]  # routing frames to prepend (the ROUTER's identity), or []
    queue: deque[tuple[float, Sequence[Any]]] = field(default_factory=deque)  # (parked at, frames)


class Port:
    """All sockets of one actor, driven by one thread.

    on_message(Inbound) and on_bad_frame(BadFrame) run in the port thread and must not block
    (the actor host only `tell`s its pykka actor). `on_timer` runs every `timer_s` seconds.
    """

    def __init__(
        self,
        ctx: zmq.SyncContext,
        name: str,
        bind: str | None,
        peers: dict[str, str],
        on_message: Callable[[Inbound[Msg]], None],
        on_bad_frame: Callable[[BadFrame], None],
        on_timer: Callable[[float], None] | None = None,
        timer_s: float = 0.05,
        on_send_failed: Callable[[str, str], None] | None = None,
        limits: Limits = Limits(),
        security: Security | None = None,
        on_auth_failed: Callable[[str, str], None] | None = None,
        on_crash: Callable[[str], None] | None = None,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self.ctx, self.name, self.bind, self.peers = ctx, name, bind, dict(peers)
        self.on_message, self.on_bad_frame = on_message, on_bad_frame
        self.on_timer, self.timer_s = on_timer, timer_s
        self.on_send_failed = on_send_failed or (lambda dest, why: None)
        self.on_auth_failed = on_auth_failed or (lambda where, why: None)
        self.on_crash = on_crash or (lambda error: None)
        self.backlog = backlog or (lambda: 0)
        self.limits, self.security = limits, security
        self._monitors: dict[zmq.SyncSocket, str] = {}
        self.routing_id = f"{name}#{secrets.token_hex(8)}".encode()
        self._outbox_addr = f"inproc://outbox-{name}-{next(_outbox_ids)}"
        self._local = threading.local()
        self._pushers: list[zmq.SyncSocket] = []
        self._parked: dict[bytes, _Parked] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._flushes: dict[int, threading.Event] = {}  # flush token -> set when the port thread routed it
        self._linger_ms = 0  # of the peer sockets when the port thread closes them
        self._error: BaseException | None = None  # opening the sockets failed (start() raises it)
        self._thread = threading.Thread(target=self._run, name=f"port-{name}", daemon=True)

    # --- public API -------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"port {self.name}: sockets not ready after {timeout_s}s")
        if self._error is not None:
            raise self._error

    def send(self, dest: Dest, msg: Msg, payloads: Sequence[Frame] = ()) -> None:
        """Queue `msg` for `dest`; safe from any thread."""
        self.send_frames(dest, encode(msg, payloads))

    def send_frames(self, dest: Dest, frames: Sequence[Frame]) -> None:
        head = [b"p", dest.name.encode()] if dest.name else [b"r", dest.identity]
        self._push().send_multipart([*head, *frames], copy=False)

    def _push(self) -> zmq.SyncSocket:
        """This thread's end of the handover queue (the port thread reads each one in order)."""
        sock: zmq.SyncSocket | None = getattr(self._local, "push", None)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.limits.outbox_hwm)
            sock.connect(self._outbox_addr)
            self._local.push = sock
            self._pushers.append(sock)
        return sock

    def flush(self, timeout_s: float = 1.0) -> bool:
        """Wait until the port thread has routed every message this thread sent before (handed to
        its socket, or parked): True, or False after `timeout_s` (or with no port thread running).
        The port thread acknowledges a marker queued behind them; nothing is slept on."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return False
        token = next(_flush_ids)
        done = self._flushes[token] = threading.Event()
        try:
            self._push().send_multipart([b"f", str(token).encode()])
            return done.wait(timeout_s)
        finally:
            self._flushes.pop(token, None)

    def stop(self, timeout_s: float = 5.0, linger_ms: int = 0) -> None:
        """End the port thread and close its sockets. `linger_ms` (after a `flush`): how long libzmq
        may still send what was routed to a peer; 0 drops it (a dead peer keeps nothing alive)."""
        self._linger_ms = linger_ms
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        for s in self._pushers:
            s.close(linger=0)
        self._pushers.clear()

    # --- the port thread -------------------------------------------------------------------

    def _bounded(self, kind: int, name: str) -> zmq.SyncSocket:
        sock: zmq.SyncSocket = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, self.limits.hwm)
        sock.setsockopt(zmq.RCVHWM, self.limits.hwm)
        sock.setsockopt(zmq.LINGER, 0)
        if self.limits.max_bytes(name):
            sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_bytes(name))
        if self.security is not None:
            mon = sock.get_monitor_socket(_HANDSHAKE_FAILED)
            self._monitors[mon] = name
        return sock

    def _make_sockets(self) -> tuple[zmq.SyncSocket, zmq.SyncSocket | None, dict[str, zmq.SyncSocket]]:
        outbox = self.ctx.socket(zmq.PULL)
        outbox.setsockopt(zmq.RCVHWM, self.limits.outbox_hwm)
        outbox.bind(self._outbox_addr)
        router = None
        if self.bind:
            router = self._bounded(zmq.ROUTER, ROUTER)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if self.security is not None:
                self.security.serve(self.ctx, router)
            router.bind(self.bind)
        dealers = {}
        for peer, addr in self.peers.items():
            d = self._bounded(zmq.DEALER, peer)
            if self.security is not None:
                self.security.connect(d, peer)
            d.setsockopt(zmq.ROUTING_ID, self.routing_id)
            d.setsockopt(zmq.RECONNECT_IVL, 50)
            d.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            d.connect(addr)
            dealers[peer] = d
        return outbox, router, dealers

    def _run(self) -> None:
        socks: list[zmq.SyncSocket] = []
        try:
            outbox, router, dealers = self._make_sockets()
            socks = [outbox, *([router] if router else []), *dealers.values()]
        except (zmq.ZMQError, OSError) as exc:  # OSError: a key file (auth.KeysError is not one)
            self._error = OSError(f"port {self.name}: cannot open sockets ({self.bind or ''}): {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. auth.KeysError: reported by start()
            self._error = exc
        if self._error is not None:
            self._ready.set()
            self._close([*socks, *self._monitors])
            return
        self._ready.set()
        try:
            self._loop(outbox, router, dealers)
        except Exception as exc:  # a bug here must not leave a deaf actor behind: the actor crashes
            self.on_crash(f"port thread: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self._close([*socks[1:]], self._linger_ms)  # the peer sockets: what was routed may still go out
            self._close([*socks[:1], *self._monitors])

    def _close(self, socks: Sequence[zmq.SyncSocket], linger_ms: int = 0) -> None:
        for s in socks:
            s.close(linger=linger_ms)

    def _loop(self, outbox: zmq.SyncSocket, router: zmq.SyncSocket | None, dealers: dict[str, zmq.SyncSocket]) -> None:
        full, lean = zmq.Poller(), zmq.Poller()  # lean: while the actor is behind, read no peer
        for s in [outbox, *([router] if router else []), *dealers.values(), *self._monitors]:
            full.register(s, zmq.POLLIN)
        for s in [outbox, *self._monitors]:
            lean.register(s, zmq.POLLIN)
        by_socket = {d: name for name, d in dealers.items()}
        next_timer = time.monotonic()
        while not self._stop.is_set():
            timeout_ms = max(0, int((next_timer - time.monotonic()) * 1000)) if self.on_timer else 100
            if self._parked:
                timeout_ms = min(timeout_ms, 2)
            poller = full
            if self.backlog() > self.limits.max_backlog:
                poller, timeout_ms = lean, min(timeout_ms, 5)
            for sock, _ in poller.poll(min(timeout_ms, 100)):
                self._drain(sock, outbox, router, dealers, by_socket)
            now = time.monotonic()
            self._retry_parked(now)
            if self.on_timer and now >= next_timer:
                next_timer = now + self.timer_s
                self.on_timer(now)

    def _drain(
        self,
        sock: zmq.SyncSocket,
        outbox: zmq.SyncSocket,
        router: zmq.SyncSocket | None,
        dealers: dict[str, zmq.SyncSocket],
        by_socket: dict[zmq.SyncSocket, str],
    ) -> None:
        for _ in range(1000):  # bounded, so one busy socket cannot starve the others
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if sock is outbox:
                self._route_out(frames, router, dealers)
            elif sock is router:
                self._deliver(frames[1:], None, frames[0].bytes)
            elif sock in self._monitors:
                self._handshake_failed(self._monitors[sock], frames)
            else:
                self._deliver(frames, by_socket[sock], b"")

    def _deliver(self, frames: list[zmq.Frame], peer: str | None, identity: bytes) -> None:
        t = time.monotonic()
        if not frames:  # a ROUTER message with nothing after the routing id
            self.on_bad_frame(BadFrame(ProtocolError(ErrorCode.MALFORMED, "empty message"), peer, identity))
            return
        principal = peer if peer is not None else self._principal(frames[0], identity)
        try:
            msg, payloads = decode([f.buffer for f in frames], self.limits.max_bytes(peer or ROUTER))
        except ProtocolError as err:
            self.on_bad_frame(BadFrame(err, peer, identity))
            return
        self.on_message(Inbound(msg, payloads, peer, identity, t, principal))

    def _principal(self, frame: zmq.Frame, identity: bytes) -> str:
        """The ROUTER peer's key name (CURVE), or its routing id when nothing is authenticated."""
        if self.security is None:
            return name_of_id(identity)
        try:
            return str(frame.get("User-Id"))
        except zmq.ZMQError:  # no ZAP label: not authenticated, refused by the core
            return ""

    def _handshake_failed(self, where: str, frames: list[zmq.Frame]) -> None:
        event = parse_monitor_message([f.bytes for f in frames])
        kind = str(zmq.Event(event["event"]).name or event["event"]).lower()
        detail = f"{kind} (value {event['value']})"
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH and where == ROUTER:
            detail += f" {pop_denial(self.ctx, time.monotonic() - 5.0)}"
        self.on_auth_failed(where, detail.strip())

    def _route_out(
        self, frames: list[zmq.Frame], router: zmq.SyncSocket | None, dealers: dict[str, zmq.SyncSocket]
    ) -> None:
        kind, target, body = frames[0].bytes, frames[1].bytes, frames[2:]
        if kind == b"f":  # a flush marker: every message queued before it by that thread is routed
            done = self._flushes.get(int(target))
            if done is not None:
                done.set()
            return
        if kind == b"p":
            sock = dealers.get(target.decode())
            head: list[Frame] = []
        else:
            sock, head = router, [target]
        if sock is None:
            self.on_send_failed(target.decode(errors="replace"), "no such peer" if kind == b"p" else "no router socket")
            return
        self._send_or_park(kind + target, sock, head, body)

    def _send_or_park(self, key: bytes, sock: zmq.SyncSocket, head: list[Frame], body: Sequence[Any]) -> None:
        parked = self._parked.get(key)
        if parked is not None:  # keep the order: behind what already waits
            parked.queue.append((time.monotonic(), body))
            if len(parked.queue) > self.limits.max_parked:
                self._give_up(key, f"more than {self.limits.max_parked} messages queued")
            return
        try:
            sock.send_multipart([*head, *body], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self._parked[key] = _Parked(sock, head, deque([(time.monotonic(), body)]))
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            self.on_send_failed(key[1:].decode(errors="replace"), str(exc))

    def _retry_parked(self, now: float) -> None:
        for key in list(self._parked):
            parked = self._parked[key]
            try:
                while parked.queue:
                    parked.sock.send_multipart([*parked.head, *parked.queue[0][1]], zmq.NOBLOCK, copy=False)
                    parked.queue.popleft()
            except zmq.Again:
                if now - parked.queue[0][0] > self.limits.park_timeout_s:
                    self._give_up(key, f"queue full for {self.limits.park_timeout_s:g}s")
                continue
            except zmq.ZMQError as exc:
                self._give_up(key, str(exc))
                continue
            del self._parked[key]

    def _give_up(self, key: bytes, why: str) -> None:
        dropped = len(self._parked.pop(key).queue)
        self.on_send_failed(key[1:].decode(errors="replace"), f"{why}: dropped {dropped} messages")
