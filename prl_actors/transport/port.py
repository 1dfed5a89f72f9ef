"""ZeroMQ behind a small interface: one `Port` per actor owns all of that actor's sockets.

Topology: an actor that serves others binds one ROUTER (`bind`); it reaches its peers through one
DEALER per peer (`peers`), whose routing id is the actor's name, so a ROUTER sees who is talking.

Hazards, and what this module does about them:
- ZeroMQ sockets are not thread-safe. Only the port thread touches them; other threads hand frames
  over through `send`, which goes through an inproc PUSH/PULL outbox (one PUSH per calling thread).
- A ROUTER silently drops a message to an unknown routing id; `ROUTER_MANDATORY` makes that an error
  we log and count instead. `ROUTER_HANDOVER` lets a restarted peer with the same name take over.
- DEALER queues up to the high-water mark and then blocks; the port never blocks in send
  (NOBLOCK): a message that cannot go is logged as `send_failed`, never a silent hang.
- Sockets close with linger 0 in a `finally`, so a dead peer never keeps a process alive.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from prl_actors.protocol.codec import Frame, ProtocolError, decode, encode
from prl_actors.protocol.messages import Msg

_outbox_ids = itertools.count()


@dataclass
class Inbound:
    """A decoded message. `peer` is the DEALER peer name it came from, or None when it came in
    on the ROUTER, in which case `identity` is the sender's routing id (for replies)."""

    msg: Any  # one of protocol.messages.Message; Core.handle dispatches on its tag to on_<tag>
    payloads: list[Frame]
    peer: str | None = None
    identity: bytes = b""
    t_recv: float = 0.0


@dataclass
class BadFrame:
    error: ProtocolError
    peer: str | None
    identity: bytes


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
        return f"peer:{self.name}" if self.name else f"id:{self.identity.decode(errors='replace')}"


class Port:
    """All sockets of one actor, driven by one thread.

    on_message(Inbound) and on_bad_frame(BadFrame) run in the port thread and must not block
    (the actor host only `tell`s its pykka actor). `on_timer` runs every `timer_s` seconds.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        name: str,
        bind: str | None,
        peers: dict[str, str],
        on_message: Callable[[Inbound], None],
        on_bad_frame: Callable[[BadFrame], None],
        on_timer: Callable[[float], None] | None = None,
        timer_s: float = 0.05,
        on_send_failed: Callable[[str, str], None] | None = None,
    ) -> None:
        self.ctx, self.name, self.bind, self.peers = ctx, name, bind, dict(peers)
        self.on_message, self.on_bad_frame = on_message, on_bad_frame
        self.on_timer, self.timer_s = on_timer, timer_s
        self.on_send_failed = on_send_failed or (lambda dest, why: None)
        self._outbox_addr = f"inproc://outbox-{name}-{next(_outbox_ids)}"
        self._local = threading.local()
        self._pushers: list[zmq.Socket] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
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
        sock = getattr(self._local, "push", None)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(self._outbox_addr)
            self._local.push = sock
            self._pushers.append(sock)
        head = [b"p", dest.name.encode()] if dest.name else [b"r", dest.identity]
        sock.send_multipart([*head, *frames], copy=False)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        for s in self._pushers:
            s.close(linger=0)
        self._pushers.clear()

    # --- the port thread -------------------------------------------------------------------

    def _make_sockets(self) -> tuple[zmq.Socket, zmq.Socket | None, dict[str, zmq.Socket]]:
        outbox = self.ctx.socket(zmq.PULL)
        outbox.setsockopt(zmq.RCVHWM, 0)
        outbox.bind(self._outbox_addr)
        router = None
        if self.bind:
            router = self.ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            router.setsockopt(zmq.SNDHWM, 0)
            router.setsockopt(zmq.RCVHWM, 0)
            router.bind(self.bind)
        dealers = {}
        for peer, addr in self.peers.items():
            d = self.ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.ROUTING_ID, self.name.encode())
            d.setsockopt(zmq.SNDHWM, 0)
            d.setsockopt(zmq.RCVHWM, 0)
            d.setsockopt(zmq.RECONNECT_IVL, 50)
            d.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            d.connect(addr)
            dealers[peer] = d
        return outbox, router, dealers

    def _run(self) -> None:
        socks: list[zmq.Socket] = []
        try:
            outbox, router, dealers = self._make_sockets()
            socks = [outbox, *([router] if router else []), *dealers.values()]
        except zmq.ZMQError as exc:
            self._error = OSError(f"port {self.name}: cannot open sockets ({self.bind or ''}): {exc}")
            self._ready.set()
            for s in socks:
                s.close(linger=0)
            return
        self._ready.set()
        try:
            self._loop(outbox, router, dealers)
        finally:
            for s in socks:
                s.close(linger=0)

    def _loop(self, outbox: zmq.Socket, router: zmq.Socket | None, dealers: dict[str, zmq.Socket]) -> None:
        poller = zmq.Poller()
        for s in [outbox, *([router] if router else []), *dealers.values()]:
            poller.register(s, zmq.POLLIN)
        by_socket = {d: name for name, d in dealers.items()}
        next_timer = time.monotonic()
        while not self._stop.is_set():
            timeout_ms = max(0, int((next_timer - time.monotonic()) * 1000)) if self.on_timer else 100
            for sock, _ in poller.poll(min(timeout_ms, 100)):
                self._drain(sock, outbox, router, dealers, by_socket)
            now = time.monotonic()
            if self.on_timer and now >= next_timer:
                next_timer = now + self.timer_s
                self.on_timer(now)

    def _drain(self, sock, outbox, router, dealers, by_socket) -> None:  # type: ignore[no-untyped-def]
        for _ in range(1000):  # bounded, so one busy socket cannot starve the others
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if sock is outbox:
                self._route_out(frames, router, dealers)
            elif sock is router:
                self._deliver(frames[1:], None, frames[0].bytes)
            else:
                self._deliver(frames, by_socket[sock], b"")

    def _deliver(self, frames: list, peer: str | None, identity: bytes) -> None:  # type: ignore[type-arg]
        t = time.monotonic()
        try:
            msg, payloads = decode([f.buffer for f in frames])
        except ProtocolError as err:
            self.on_bad_frame(BadFrame(err, peer, identity))
            return
        self.on_message(Inbound(msg, payloads, peer, identity, t))

    def _route_out(self, frames: list, router: zmq.Socket | None, dealers: dict[str, zmq.Socket]) -> None:  # type: ignore[type-arg]
        kind, target, body = frames[0].bytes, frames[1].bytes, frames[2:]
        try:
            if kind == b"p":
                sock = dealers.get(target.decode())
                if sock is None:
                    self.on_send_failed(target.decode(), "no such peer")
                    return
                sock.send_multipart(body, zmq.NOBLOCK, copy=False)
            elif router is not None:
                router.send_multipart([target, *body], zmq.NOBLOCK, copy=False)
            else:
                self.on_send_failed(target.decode(errors="replace"), "no router socket")
        except zmq.ZMQError as exc:  # EHOSTUNREACH (peer gone) or EAGAIN (queue full)
            self.on_send_failed(target.decode(errors="replace"), str(exc))
