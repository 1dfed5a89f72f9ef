"""The actor runtime: a pure `Core` per role, hosted by a pykka actor fed by a ZeroMQ `Port`.

    socket -> Port thread (decode at the edge) -> pykka inbox (tell) -> Core.handle -> outbox -> Port

The core never touches a socket: it appends (Dest, message) pairs to `self.outbox`, which the host
flushes after every call. Cores are therefore unit-testable without sockets and (the Coordinator)
replayable from logs. A request that expects a reply is registered with `expect`, and the core's
`tick` turns an overdue one into a logged `request_timeout` and a callback: nothing waits forever.

`Core` is composed of small parts, each with its own unit tests (tests/test_runtime_parts.py):
dispatch.py, refusals.py (trust, refusal counts), edge.py (bad frames, failed handshakes and sends,
refusals before any handler), requests.py, member_client.py, lifecycle.py; `Forward` (forward.py)
makes a part's attribute a core's (`core.epoch` is `core.log.epoch`).

Dispatch is typed: a handler is a method marked `@handles(SomeMessage)` taking `Inbound[SomeMessage]`,
so mypy checks every field it reads. Each core's table (message class -> method name) is collected
from its class and bases; a core that lacks a handler for a message its role can receive (per
`protocol.routes`) fails when it is built, and a message its role cannot receive is answered
`unexpected` whatever handlers exist.

Trust: before a handler runs, `forbidden` checks the message against its *authenticated* sender
(`Inbound.who`, see transport/port.py): the sender's role (the part of its key name before '-') must
be one that `protocol.routes` lets send this message to this role; on the bound socket the message's
`sender` field and routing id must be names its key covers (`auth.speaks_for`); a `register` must
claim the key's own role. Anything else is refused with `error` `forbidden`, counted and logged, and
changes nothing. Refusals (failed handshakes, forbidden, malformed, unexpected) are also summed into
every heartbeat's `refused`, so `prl-actors status` shows them per member; their log lines are
rate-limited (the first `LOUD_FIRST` of each kind, then one per `LOUD_EVERY`), their counts are not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgspec
import pykka
import zmq

from prl_actors.protocol.codec import Frame, encode
from prl_actors.protocol.messages import (
    Ack,
    Error,
    ErrorCode,
    GenerationContract,
    Heartbeat,
    HeartbeatAck,
    Msg,
    Register,
    Role,
    Shutdown,
    Welcome,
    new_id,
    tag_of,
)
from prl_actors.protocol.routes import receivable, senders_of
from prl_actors.runtime.dispatch import handler_table, missing_handlers
from prl_actors.runtime.dispatch import handles as handles  # re-exported: the actors mark handlers with it
from prl_actors.runtime.edge import Edge
from prl_actors.runtime.forward import Forward
from prl_actors.runtime.lifecycle import Lifecycle
from prl_actors.runtime.member_client import MembershipClient
from prl_actors.runtime.refusals import LOUD_EVERY as LOUD_EVERY  # re-exported (the worker's reward errors)
from prl_actors.runtime.refusals import LOUD_FIRST as LOUD_FIRST
from prl_actors.runtime.refusals import REFUSALS as REFUSALS  # re-exported (the coordinator's Status)
from prl_actors.runtime.refusals import Counters, Trust, Who
from prl_actors.runtime.requests import Requests
from prl_actors.transport.port import BadFrame, Dest, Inbound, Limits, Port

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog
    from prl_actors.transport.auth import Security

M = TypeVar("M", bound=Msg)

# Messages too frequent to log one event each (heartbeats are counted, chunks are logged per transfer).
# env_step/env_step_result: one per vector step; the learner logs their accounting as `env_steps` instead.
QUIET_TYPES = frozenset({"heartbeat", "heartbeat_ack", "weight_chunk", "credit", "env_step", "env_step_result"})
STOP_FLUSH_S = 1.0  # at stop: the longest wait for the port thread to route the last messages
STOP_LINGER_MS = 200  # ... and for libzmq to send them (a peer gone: dropped after this)


class StartFailed(Exception):
    """An actor could not be built or started (model, engine, checkpoint); the message is one line."""


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (library errors can span many lines), at most 300 chars."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass
class Tick:
    now: float


@dataclass
class SendFailed:
    dest: str
    why: str


@dataclass
class Deferred:
    fn: Callable[[float], None]


@dataclass
class AuthFailed:
    """A failed handshake on one socket: `where` is ROUTER (a peer we refused) or a peer name (a
    server that refused us, or whose key is not the one we hold)."""

    where: str
    why: str


@dataclass
class PortCrashed:
    error: str


@dataclass
class StopRequest:
    """From outside the actor (signal, test): stop cleanly; a worker leaves gracefully first."""

    reason: str


class Core:
    """Base of every actor's logic, composed of small parts (each unit-tested on its own):
    dispatch (`dispatch.py`: the handler table), trust and refusal counts (`refusals.py`), requests
    with timeouts (`requests.py`), the membership client (`member_client.py`; not in a role that
    is a membership server: `joins = False`) and the lifecycle (`lifecycle.py`). The methods here
    are the actors' vocabulary over those parts (emit, reply, refuse, expect, count, fail ...).

    No member waits for its coordinator forever: a Register unanswered for `join_timeout_s`, a
    refused Register, or `join_timeout_s` without a word from the coordinator once registered (its
    heartbeat acks stop) makes the actor `fail` with a one-line reason."""

    role: ClassVar[Role]
    membership_peer: ClassVar[str] = "coordinator"  # the peer this role registers and heartbeats with
    joins: ClassVar[bool] = True  # False: a membership server (the coordinator), no membership client
    handlers: ClassVar[dict[type[Msg], str]] = {}
    join_timeout_s = 60.0  # set from transport.join_timeout_s by topology.start_actor
    fatal_errors: ClassVar[bool] = False  # a handler exception fails the actor (else: logged, it lives on)
    coordinator_addr = "the coordinator"
    contract: GenerationContract | None = None  # what it generates under, sent in Register (runtime/contract.py)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.handlers = handler_table(cls)

    def __init__(self, name: str, log: EventLog) -> None:
        self.receives = receivable(self.role)
        missing = sorted(tag_of(t) for t in missing_handlers(self.handlers, self.receives))
        if missing:
            raise TypeError(f"{type(self).__name__} ({self.role}) has no handler for: {', '.join(missing)}")
        self.name, self.log = name, log
        self.outbox: list[tuple[Dest, Msg, Sequence[Frame]]] = []
        self.deferred: list[Callable[[float], None]] = []
        self.now = 0.0  # the time of the input being handled (deterministic replay: no clock reads)
        self.life = Lifecycle()
        self.tally = Counters()
        self.trust = Trust(self.role, {t: senders_of(t, self.role) for t in self.receives})
        self.requests = Requests()
        self.membership_client = MembershipClient(self.membership_peer) if self.joins else None
        self.edge = Edge(self)  # bad frames, failed handshakes and sends, refusals before any handler

    # epoch/version live on the log so every event carries them; the parts' state, as the actors read it
    epoch = Forward[int]("log", "epoch")
    version = Forward[int]("log", "version")
    stopped = Forward[bool]("life", "stopped")
    failure = Forward[str | None]("life", "failure", settable=False)
    counters = Forward[dict[str, int]]("tally", "counts", settable=False)
    refused = Forward[int]("tally", "refused", settable=False)

    @property
    def registered(self) -> bool:
        return self.membership_client is not None and self.membership_client.registered

    @registered.setter
    def registered(self, value: bool) -> None:
        if self.membership_client is not None:
            self.membership_client.registered = value

    def count(self, key: str, n: int = 1) -> int:
        return self.tally.count(key, n)

    def count_loud(self, key: str, who: Who | None = None) -> bool:
        """Count one refusal of kind `key`; True when it should also be logged (rate limit); else it
        waits, by `who` (type, sender, key), for the next `refusals` summary."""
        return self.tally.loud(key, who)

    # --- sending -----------------------------------------------------------------------------

    def emit(self, dest: Dest, msg: M, payloads: Sequence[Frame] = (), log: bool = True) -> M:
        msg.sender = self.name
        tag = tag_of(msg)
        if log and tag not in QUIET_TYPES:
            self.log(
                "send",
                type=tag,
                msg_id=msg.id,
                to=repr(dest),
                reply_to=getattr(msg, "reply_to", ""),
                msg_epoch=msg.epoch,
                msg_version=msg.version,
            )
        self.outbox.append((dest, msg, payloads))
        return msg

    def reply(self, inbound: Inbound[Msg], msg: M, payloads: Sequence[Frame] = ()) -> M:
        return self.emit(self.source(inbound), msg, payloads)

    @staticmethod
    def source(inbound: Inbound[Msg]) -> Dest:
        """Where a reply to `inbound` goes."""
        return Dest.peer(inbound.peer) if inbound.peer else Dest.reply(inbound.identity)

    def refuse(
        self, inbound: Inbound[Msg], detail: str, code: ErrorCode = ErrorCode.REJECTED, quiet: bool = False
    ) -> None:
        """Answer `inbound` with an Error (the uniform refusal), counted and logged (rate-limited).
        `quiet`: log the answer's `send` only with its `refused` event (a flood cannot fill the disk)."""
        loud = self.edge.note_refusal(inbound, "refused", f"refused.{code}", code, detail)
        self.emit(self.source(inbound), Error(reply_to=inbound.msg.id, code=code, detail=detail), log=loud or not quiet)

    def forbidden(self, inbound: Inbound[Msg]) -> str:
        """Why the authenticated sender may not send this message here ("" when it may)."""
        return self.trust.forbidden(inbound)

    def defer(self, fn: Callable[[float], None]) -> None:
        """Run `fn(now)` as a later inbox item: what was emitted so far is sent first, and messages
        that arrive meanwhile are handled in between (for long work such as generation)."""
        self.deferred.append(fn)

    def expect(self, msg: Msg, timeout_s: float, what: str, on_timeout: Callable[[float], None] | None) -> None:
        """Register that `msg` wants a reply within `timeout_s`."""
        self.requests.expect(msg.id, self.now + timeout_s, what, on_timeout)

    # --- entry points, called by the host -------------------------------------------------------

    def start(self, now: float) -> None:  # noqa: B027 - optional hook
        """Called once when the sockets are up."""

    def handle(self, now: float, inbound: Inbound[Msg]) -> None:
        msg = inbound.msg
        tag = tag_of(msg)
        name = self.handlers.get(type(msg)) if type(msg) in self.receives else None
        if name is None:
            self.edge.refuse_early(
                inbound, "unexpected_message", ErrorCode.UNEXPECTED, f"{self.role} does not handle {tag!r}"
            )
            return
        why = self.forbidden(inbound)
        if why:
            self.edge.refuse_early(inbound, "forbidden_message", ErrorCode.FORBIDDEN, why)
            return
        self.admitted(now, inbound)
        reply_to = getattr(msg, "reply_to", "")
        if reply_to:
            self.requests.answered(reply_to)
        if self.membership_client is not None and inbound.peer == self.membership_client.peer:
            self.membership_client.heard_from(now)
        if tag not in QUIET_TYPES:
            self.log(
                "recv",
                type=tag,
                msg_id=msg.id,
                sender=msg.sender,
                reply_to=reply_to,
                msg_epoch=msg.epoch,
                msg_version=msg.version,
            )
        getattr(self, name)(now, inbound)

    def admitted(self, now: float, inbound: Inbound[Msg]) -> None:  # noqa: B027 - optional hook
        """Called for every message that passed the checks, before it is logged as received and handled."""

    def tick(self, now: float) -> None:
        for msg_id, p in self.requests.overdue(now):
            self.count("request_timeout")
            self.log("request_timeout", msg_id=msg_id, what=p.what)
            if p.on_timeout is not None:
                p.on_timeout(now)
        client = self.membership_client
        silent = client.silent_for(now, self.join_timeout_s) if client is not None else None
        if silent is not None:
            self.fail(f"lost the coordinator at {self.coordinator_addr}: nothing heard for {silent:.0f}s")

    # --- membership (the membership client's messages) ----------------------------------------

    def register(self) -> None:
        assert self.membership_client is not None, f"a {self.role} is a membership server: it does not register"
        msg = Register(role=self.role, pid=os.getpid(), host=socket.gethostname(), contract=self.contract)
        self.membership_client.registering(self.emit(Dest.peer(self.membership_peer), msg).id)
        self.expect(msg, self.join_timeout_s, "welcome", self._register_timed_out)

    def _register_timed_out(self, now: float) -> None:
        self.fail(
            f"no answer from the {self.membership_peer} at {self.coordinator_addr} within {self.join_timeout_s:g}s "
            "(is the run up? a run that is over no longer answers)"
        )

    @handles(Welcome)
    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        if self.membership_client is not None:
            self.membership_client.welcomed(now)
        self.log("registered", run_id=inbound.msg.run_id)

    @handles(HeartbeatAck)
    def on_heartbeat_ack(self, now: float, inbound: Inbound[HeartbeatAck]) -> None:
        if not inbound.msg.known and self.membership_client is not None and self.membership_client.forgotten():
            self.log("re_register", reason="the coordinator does not know us (timed out?)")
            self.register()

    @handles(Ack)
    def on_ack(self, now: float, inbound: Inbound[Ack]) -> None:
        """Acks need no action; the pending-request entry was cleared in `handle`."""

    @handles(Error)
    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        msg = inbound.msg
        self.count("peer_error")
        self.log("peer_error", code=msg.code, detail=msg.detail, reply_to=msg.reply_to, sender=msg.sender)
        if self.membership_client is not None and self.membership_client.refused(msg.reply_to):
            self.fail(f"the coordinator refused to register {self.name}: {msg.detail}")

    @handles(Shutdown)
    def on_shutdown(self, now: float, inbound: Inbound[Shutdown]) -> None:
        """The run is over (or stopping). A member that joins a finished run is told so this way."""
        self.log("shutdown", reason=inbound.msg.reason, joined=self.registered)
        self.life.stop()

    def request_stop(self, reason: str) -> None:
        self.log("stop_requested", reason=reason)
        self.life.stop()

    def fail(self, reason: str) -> None:
        """The actor cannot do its job (refused, lost its coordinator ...): stop, and make the process
        exit non-zero with `reason` as its one-line error."""
        self.life.fail(reason)

    def heartbeat(self) -> Heartbeat | None:
        """What this member's heartbeats say now (None: send none). The host asks after every input
        and the port thread sends the latest answer: it never reads the core itself."""
        return Heartbeat(epoch=self.epoch, version=self.version, refused=self.refused) if self.registered else None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (engines, files)."""


class ActorHost(pykka.ThreadingActor):
    """Hosts one Core and its Port. Everything the core does runs in this actor's thread."""

    def __init__(
        self,
        core: Core,
        ctx: zmq.Context,  # type: ignore[type-arg]
        bind: str | None,
        peers: dict[str, str],
        tick_s: float = 0.05,
        heartbeat_s: float | None = None,
        limits: Limits = Limits(),
        security: Security | None = None,
    ) -> None:
        super().__init__()
        self.core, self.ctx = core, ctx
        self.done = threading.Event()
        self.error: str | None = None
        self._tick_queued = threading.Event()
        self._heartbeat_s = heartbeat_s
        self._heartbeat: Heartbeat | None = None  # written by the actor thread, read by the port thread
        self._next_heartbeat = 0.0
        self._heartbeat_dest = Dest.peer(core.membership_peer)
        self.port = Port(
            ctx,
            core.name,
            bind,
            peers,
            on_message=self._tell,
            on_bad_frame=self._tell,
            on_timer=self._on_timer,
            timer_s=tick_s,
            on_send_failed=lambda dest, why: self._tell(SendFailed(dest, why)),
            limits=limits,
            security=security,
            on_auth_failed=lambda where, why: self._tell(AuthFailed(where, why)),
            on_crash=self._port_crashed,
            backlog=self._backlog,
        )

    def _backlog(self) -> int:
        """Items waiting in the actor's inbox (a queue.Queue in a ThreadingActor); port thread."""
        inbox: Any = self.actor_inbox
        return int(inbox.qsize())

    def _tell(self, message: object) -> None:
        """From the port thread; after the actor stopped there is nobody to tell (shutdown race)."""
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(message)

    def _on_timer(self, now: float) -> None:
        """Port thread: queue one Tick at a time (a busy actor gets no pile of stale ticks);
        heartbeats go straight out so a long generate() does not look like a dead worker."""
        if not self._tick_queued.is_set():
            self._tick_queued.set()
            self._tell(Tick(now))
        hb = self._heartbeat
        if self._heartbeat_s and hb is not None and now >= self._next_heartbeat:
            self._next_heartbeat = now + self._heartbeat_s
            self.port.send_frames(self._heartbeat_dest, encode(msgspec.structs.replace(hb, id=new_id())))

    def on_start(self) -> None:
        try:
            self.port.start()
        except (OSError, TimeoutError) as exc:  # e.g. address in use; pykka would die without on_failure
            self._fail(str(exc))
            return
        self.core.log("actor_ready", address=self.port.bind or "")  # bound: peers can reach it now
        self._run(lambda now: self.core.start(now), failing="failed to start")

    def on_receive(self, message: Any) -> None:
        if isinstance(message, PortCrashed):  # `error` is already set (by the port thread)
            self.core.log("actor_crashed", error=message.error)
            self.stop()
            return
        if self.error is not None:  # failed: it only waits for its stop to be processed
            return
        if isinstance(message, Inbound):
            self._run(lambda now: self.core.handle(now, message), what=tag_of(message.msg))
        elif isinstance(message, Tick):
            self._tick_queued.clear()
            self._run(self.core.tick)
            self.core.edge.summarize(message.now)
        elif isinstance(message, BadFrame):
            self._run(lambda now: self.core.edge.bad_frame(now, message))
        elif isinstance(message, SendFailed):
            self._run(lambda now: self.core.edge.send_failed(now, message))
        elif isinstance(message, Deferred):
            self._run(message.fn)
        elif isinstance(message, AuthFailed):
            self._run(lambda now: self.core.edge.auth_failed(now, message))
        elif isinstance(message, StopRequest):
            self._run(lambda now: self.core.request_stop(message.reason))

    def _port_crashed(self, error: str) -> None:
        """Port thread: its loop died. The actor cannot talk any more, so it ends, loudly: `error` is
        set at once (the process exits non-zero with it) and the actor thread logs it and stops."""
        self.error = error
        self._tell(PortCrashed(error))

    def _run(self, fn: Callable[[float], None], failing: str | None = None, what: str = "") -> None:
        """Call into the core. An exception is logged as `handler_error` and the actor lives on (a
        bug handling one message must not take the actor down), unless `failing` says the call is
        one the actor cannot do without (its start): then the actor fails with that cause."""
        self.core.now = now = time.monotonic()
        try:
            fn(now)
        except Exception as exc:
            if failing is not None:
                self.core.log("start_failed", error=one_line(exc), trace=traceback.format_exc())
                self.core.fail(f"{failing}: {one_line(exc)}")
            else:
                n = self.core.count("handler_error")
                if n <= LOUD_FIRST or n % LOUD_EVERY == 0:  # one repeated failure cannot fill the disk
                    error = f"{type(exc).__name__}: {exc}"
                    self.core.log("handler_error", error=error, count=n, trace=traceback.format_exc())
                if self.core.fatal_errors:  # its epoch would wait forever: end the run, loudly, at once
                    self.core.fail(f"{self.core.name} failed handling {what or 'an inbox item'}: {one_line(exc)}")
        self._flush()
        hb = self.core.heartbeat()
        if hb is not None:
            hb.sender = self.core.name
        self._heartbeat = hb
        if self.core.failure is not None:
            self._fail(self.core.failure)
        elif self.core.stopped:
            self.stop()

    def _flush(self) -> None:
        out, self.core.outbox = self.core.outbox, []
        for dest, msg, payloads in out:
            self.port.send(dest, msg, payloads)
        later, self.core.deferred = self.core.deferred, []
        for fn in later:
            self._tell(Deferred(fn))

    def on_stop(self) -> None:
        self.core.edge.summarize(time.monotonic(), force=True)
        self._flush()
        self.port.flush(STOP_FLUSH_S)  # the port thread acknowledges it routed the last messages (Shutdown, Leave)
        self.port.stop(linger_ms=STOP_LINGER_MS)  # ... and libzmq may still put them on the wire
        self.core.close()
        self.core.log("actor_stopped", counters=self.core.counters)
        self.core.log.close()
        self.done.set()

    def _fail(self, error: str) -> None:
        """The actor cannot go on: record why (its process exits non-zero with it), then stop."""
        self.error = error
        self.core.log("actor_crashed", error=error)
        self.stop()

    def on_failure(self, exception_type: Any, exception_value: Any, tb: Any) -> None:
        """A bug in the host itself (pykka skips on_stop): record it and release everything."""
        self.error = f"{exception_type.__name__}: {exception_value}"
        self.core.log("actor_crashed", error=self.error)
        self.port.stop()
        self.core.log.close()
        self.done.set()
