"""The edge, a part of every actor's Core: the inputs that are not messages for a handler, and the
refusals answered before any handler runs.

- a frame that failed decoding (`bad_frame`): logged, counted, answered with an Error;
- a failed handshake (`auth_failed`): a peer we refused is counted; a server that refused our key
  fails the actor (libzmq does not retry it);
- a send that failed (`send_failed`): counted and logged;
- a message refused before any handler (`refuse_early`: unexpected, forbidden) and the refusal notes
  every `Core.refuse` makes (`note_refusal`), rate-limited (refusals.py), their not-logged rest
  summed into one `refusals` event at most once per SUMMARY_EVERY_S (`summarize`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import Error, ErrorCode, Msg, tag_of
from prl_actors.runtime.refusals import SUMMARY_EVERY_S
from prl_actors.transport.port import ROUTER, BadFrame, Dest, Inbound, name_of_id

if TYPE_CHECKING:
    from prl_actors.runtime.core import AuthFailed, Core, SendFailed


class Edge:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.next_summary = 0.0  # the next `refusals` summary is due then (summarize)

    def note_refusal(self, inbound: Inbound[Msg], event: str, key: str, code: ErrorCode, detail: str) -> bool:
        """Count one refusal of `inbound`; log it when loud (rate limit). True when it was logged."""
        c, msg = self.core, inbound.msg
        loud = c.count_loud(key, (tag_of(msg), msg.sender, inbound.who))
        if loud:
            fields = dict(type=tag_of(msg), msg_id=msg.id, sender=msg.sender, principal=inbound.who)
            c.log(event, code=code, detail=detail, count=c.counters[key], **fields)
        return loud

    def refuse_early(self, inbound: Inbound[Msg], event: str, code: ErrorCode, detail: str) -> None:
        """Refused before any handler (unexpected, forbidden): nothing changes, nothing is logged as
        received; the refusal is counted and logged rate-limited, its answer logged only with it."""
        key = "unexpected" if code == ErrorCode.UNEXPECTED else f"refused.{code}"
        loud = self.note_refusal(inbound, event, key, code, detail)
        self.core.emit(self.core.source(inbound), Error(reply_to=inbound.msg.id, code=code, detail=detail), log=loud)

    def summarize(self, now: float, force: bool = False) -> None:
        """Log the refusals not logged one by one as one `refusals` event (counts by kind, message
        type, claimed sender and authenticated key), at most once per SUMMARY_EVERY_S (`force`: now,
        at the actor's stop). The host calls it at every tick."""
        c = self.core
        if not c.tally.unlogged or (not force and now < self.next_summary):
            return
        self.next_summary = now + SUMMARY_EVERY_S
        c.log("refusals", refused=c.tally.take_summary())

    def bad_frame(self, now: float, bad: BadFrame) -> None:
        """A frame that failed decoding: log it, count it, answer with an Error; keep running."""
        c, err = self.core, bad.error
        key = f"bad_frame.{err.code}"
        if c.count_loud(key, ("bad_frame", err.sender, bad.peer or name_of_id(bad.identity))):
            c.log("bad_frame", code=err.code, detail=err.detail, msg_id=err.reply_to, sender=err.sender)
        dest = Dest.peer(bad.peer) if bad.peer else Dest.reply(bad.identity)
        c.emit(dest, Error(reply_to=err.reply_to, code=err.code, detail=err.detail), log=False)

    def auth_failed(self, now: float, failed: AuthFailed) -> None:
        """A handshake failed: a peer we refused (ROUTER), or a server that refused us. libzmq does not
        retry a connection whose server refused our key, so that peer is gone for good: the actor
        fails at once, with the reason (a worker `up` started is replaced), rather than hold work it
        can never deliver or wait for a join timeout."""
        c = self.core
        if failed.where == ROUTER:
            if c.count_loud("auth_refused"):
                c.log("auth_refused", detail=failed.why, count=c.counters["auth_refused"])
            return
        hint = "our key is not admitted there, or we hold a wrong public key of it (docs/SECURITY.md)"
        if c.count_loud("auth_failed"):
            c.log("auth_failed", peer=failed.where, detail=failed.why, hint=hint)
        if "handshake_failed_auth" in failed.why:
            c.fail(f"the {failed.where} refused our key ({failed.why}): {hint}")

    def send_failed(self, now: float, failed: SendFailed) -> None:
        self.core.count("send_failed")
        self.core.log("send_failed", to=failed.dest, why=failed.why)
