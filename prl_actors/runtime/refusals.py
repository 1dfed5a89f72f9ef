"""Trust and refusal counts, parts of every actor's Core.

`Counters`: named counts; the refusal kinds (REFUSALS: failed handshakes, forbidden, malformed,
unexpected) are also summed into `refused`, which every heartbeat carries. `loud` rate-limits their
log lines (the first LOUD_FIRST of each kind, then one per LOUD_EVERY); their counts are exact, and
every refusal not logged on its own is kept in `unlogged`, by (kind, message type, claimed sender,
authenticated key), until the actor logs it as one `refusals` summary (Core.summarize_refusals, at
most once per SUMMARY_EVERY_S and at its stop): so the logs account for every refusal, and replay
settles the requests a flood had refused without a line each (replay/replies.py).

`Trust`: may the *authenticated* sender (`Inbound.who`) send this message to this role? Its role
(the part of its key name before '-') must be one `protocol.routes` lets send it; on the bound socket
the message's `sender` and routing id must be names its key covers (`auth.speaks_for`); a `register`
must claim the key's own role. A verdict depends only on its key, so it is remembered (bounded).
"""

from __future__ import annotations

from collections.abc import Mapping

from prl_actors.protocol.messages import Msg, Register, tag_of
from prl_actors.transport.auth import role_of_name, speaks_for
from prl_actors.transport.port import Inbound, name_of_id

REFUSALS = ("auth_refused", "auth_failed", "refused.forbidden", "refused.over_limit", "bad_frame.", "unexpected")
LOUD_FIRST, LOUD_EVERY = 50, 1000  # log lines per kind of refusal: the first 50, then every 1000th
VERDICTS_KEPT = 4096  # remembered admission verdicts per actor
SUMMARY_EVERY_S = 1.0  # at most one `refusals` summary a second per actor
SUMMARY_ROWS = 256  # distinct (kind, type, sender, key) rows per summary; more fold into sender "*"
Who = tuple[str, str, str]  # (message type, claimed sender, authenticated key)


class Counters:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.refused = 0  # the sum of the REFUSALS counters (sent in heartbeats)
        self.unlogged: dict[tuple[str, str, str, str], int] = {}  # refusals awaiting their summary

    def count(self, key: str, n: int = 1) -> int:
        total = self.counts[key] = self.counts.get(key, 0) + n
        if key.startswith(REFUSALS):
            self.refused += n
        return total

    def loud(self, key: str, who: Who | None = None) -> bool:
        """Count one of kind `key`; True when it should also be logged (rate limit). One that is not
        logged is kept for the next summary, by `who` sent it (a key's flood of made-up sender names
        folds into sender "*" past SUMMARY_ROWS rows)."""
        n = self.count(key)
        if n <= LOUD_FIRST or n % LOUD_EVERY == 0:
            return True
        if who is None and not key.startswith(REFUSALS):
            return False  # rate-limited, but no refusal (a worker's reward errors): counted only
        kind, sender, principal = who or ("", "", "")
        row = (key, kind, sender, principal)
        if row not in self.unlogged and len(self.unlogged) >= SUMMARY_ROWS:
            row = (key, kind, "*", principal)
        self.unlogged[row] = self.unlogged.get(row, 0) + 1
        return False

    def take_summary(self) -> list[dict[str, object]]:
        """The refusals not logged since the last summary, one row per (kind, type, sender, key)."""
        rows, self.unlogged = self.unlogged, {}
        return [
            {"kind": k, "type": t, "sender": s, "principal": p, "count": n} for (k, t, s, p), n in sorted(rows.items())
        ]


class Trust:
    def __init__(self, role: str, senders: Mapping[type[Msg], frozenset[str]]) -> None:
        self.role, self.senders = role, senders
        self.verdicts: dict[tuple[object, ...], str] = {}

    def forbidden(self, inbound: Inbound[Msg]) -> str:
        """Why the authenticated sender may not send this message here ("" when it may)."""
        msg = inbound.msg
        if type(msg) is Register:  # its verdict also depends on the role it claims (and it is rare)
            return self.judge(inbound)
        key = (type(msg), inbound.principal, inbound.peer, inbound.identity, msg.sender)
        why = self.verdicts.get(key)
        if why is None:
            if len(self.verdicts) >= VERDICTS_KEPT:
                self.verdicts.clear()
            why = self.verdicts[key] = self.judge(inbound)
        return why

    def judge(self, inbound: Inbound[Msg]) -> str:
        msg, who = inbound.msg, inbound.who
        role = role_of_name(who)
        allowed = self.senders.get(type(msg), frozenset())
        if role is None or role not in allowed:
            roles = ", ".join(sorted(allowed))
            return f"{tag_of(msg)!r} to a {self.role} is accepted only from {roles}, not from {who!r}"
        if inbound.peer is None:  # on our bound socket: names must be ones the sender's key covers
            if not speaks_for(who, msg.sender):
                return f"sender {msg.sender!r} is not a name the key {who!r} may use"
            if inbound.identity and not speaks_for(who, name_of_id(inbound.identity)):
                return f"routing id {name_of_id(inbound.identity)!r} is not a name the key {who!r} may use"
        if isinstance(msg, Register) and msg.role != role:
            return f"the key {who!r} may register only as a {role}, not as a {msg.role}"
        return ""
