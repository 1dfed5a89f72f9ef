"""Requests with timeouts, a part of every actor's Core: nothing waits forever.

A request that wants a reply is registered with `expect` (its deadline in the core's clock); a
reply (`reply_to`) clears it; `overdue(now)` hands back, once, each request whose deadline passed
(the core logs a `request_timeout` and calls its `on_timeout`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Pending:
    deadline: float
    what: str
    on_timeout: Callable[[float], None] | None


class Requests:
    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}  # msg id -> the request

    def expect(self, msg_id: str, deadline: float, what: str, on_timeout: Callable[[float], None] | None) -> None:
        self.pending[msg_id] = Pending(deadline, what, on_timeout)

    def answered(self, reply_to: str) -> None:
        self.pending.pop(reply_to, None)

    def any_due(self, now: float) -> bool:
        return any(p.deadline <= now for p in self.pending.values())

    def overdue(self, now: float) -> list[tuple[str, Pending]]:
        """The requests past their deadline, removed (each is reported once), oldest id first."""
        due = [(mid, p) for mid, p in self.pending.items() if p.deadline <= now]
        for mid, _ in due:
            del self.pending[mid]
        return due
