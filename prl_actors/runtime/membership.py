"""Who is in the run: the coordinator's member table (join, liveness, leave), nothing else.

Invariants: one member per name; a member's `identity` is the routing id its messages arrive with
(replies go there); `last_seen` is the time of its last message. What a member holds of the epoch's
work is not kept here (see epoch_work.py): a member is only a name, a role and liveness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Role


@dataclass
class Member:
    name: str
    role: Role
    identity: bytes
    last_seen: float
    version: int = -1  # the weight version it last said it holds
    refused: int = 0  # refusals it reported in its last heartbeat (handshakes, forbidden, malformed)
    pid: int = 0  # the process it registered from (a name is held by one process)
    host: str = ""
    key: str = ""  # the authenticated key it registered with: only that key may make it leave


class Membership:
    def __init__(self) -> None:
        self._members: dict[str, Member] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def __len__(self) -> int:
        return len(self._members)

    def get(self, name: str) -> Member | None:
        return self._members.get(name)

    def join(
        self, name: str, role: Role, identity: bytes, now: float, pid: int = 0, host: str = "", key: str = ""
    ) -> Member:
        """Add a member (the caller removes an old one of the same name first)."""
        member = Member(name, role, identity, now, pid=pid, host=host, key=key)
        self._members[name] = member
        return member

    def remove(self, name: str) -> Member | None:
        return self._members.pop(name, None)

    def seen(self, name: str, now: float) -> None:
        member = self._members.get(name)
        if member is not None:
            member.last_seen = now

    def silent(self, now: float, timeout_s: float) -> list[Member]:
        """Members not heard from for longer than `timeout_s`, by name."""
        return [m for m in self.sorted() if now - m.last_seen > timeout_s]

    def sorted(self) -> list[Member]:
        """Every member, by name (a stable order for broadcasts and replay)."""
        return [self._members[n] for n in sorted(self._members)]

    def of_role(self, *roles: Role) -> list[Member]:
        return [m for m in self.sorted() if m.role in roles]

    def first(self, role: Role) -> Member | None:
        """The member of `role` with the smallest name (the buffer, the trainer ...)."""
        return next(iter(self.of_role(role)), None)
