"""The membership client, a part of every Core that joins a run (all roles but the coordinator and
the env learner, which are membership servers): registered or not, and whether its membership peer
(the coordinator; the learner for an env actor) is lost.

No member waits for its peer forever: a Register unanswered for `join_timeout_s` (a request with a
timeout), a refused Register (an Error answering it), or `join_timeout_s` without a word from the
peer once registered (its heartbeat acks stop) makes the actor fail with a one-line reason."""

from __future__ import annotations


class MembershipClient:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.registered = False
        self.register_id = ""  # the Register in flight (an Error answering it is a refusal)
        self.heard = 0.0  # when the peer last said anything to this member

    def registering(self, msg_id: str) -> None:
        self.register_id = msg_id

    def welcomed(self, now: float) -> None:
        self.registered, self.heard = True, now

    def forgotten(self) -> bool:
        """A heartbeat ack says the peer does not know us: True when we must register again."""
        if not self.registered:
            return False
        self.registered = False
        return True

    def refused(self, reply_to: str) -> bool:
        return bool(reply_to) and reply_to == self.register_id

    def heard_from(self, now: float) -> None:
        self.heard = now

    def silent_for(self, now: float, join_timeout_s: float) -> float | None:
        """Seconds without a word from the peer once registered, when over `join_timeout_s` (lost)."""
        silent = now - self.heard
        return silent if self.registered and silent > join_timeout_s else None
