"""Admission, a part of the coordinator: who may join the run under a name (Register).

One member per name: a name held by another live process is refused, not taken over; an expelled
name never comes back; a worker under another generation contract is refused (runtime/contract.py);
a run that is over tells a late joiner so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import ErrorCode, Phase, Register, Role, Shutdown
from prl_actors.runtime import contract

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore
    from prl_actors.transport.port import Inbound


class Admission:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def refused(self, now: float, inbound: Inbound[Register]) -> bool:
        """One member per name: a name held by another live process is refused, not taken over (a
        second `prl-actors up` or a misnamed joiner must not steal a member's place). A run that is
        over tells a late joiner so. True when `inbound` was answered with a refusal."""
        c, msg = self.core, inbound.msg
        if c.phase.is_(Phase.DONE):
            c.reply(inbound, Shutdown(reason=f"the run is over ({c.done_reason})"))
            return True
        if msg.sender in c.expelled:
            c.refuse(inbound, f"{msg.sender!r} was expelled from this run (run.max_bad_groups)")
            return True
        old = c.members.get(msg.sender)
        live = old is not None and now - old.last_seen <= c.s.heartbeat_timeout_s
        if old is not None and live and old.key != inbound.who:  # pid and host are the sender's word: the key is not
            c.refuse(
                inbound,
                f"name {msg.sender!r} is held by a live member registered with another key",
                ErrorCode.FORBIDDEN,
            )
            return True
        if old is None or not live or (old.pid, old.host) == (msg.pid, msg.host):
            return self.refused_contract(inbound)
        c.refuse(inbound, f"name {msg.sender!r} is held by a live member (pid {old.pid} on {old.host})")
        return True

    def refused_contract(self, inbound: Inbound[Register]) -> bool:
        """One generation contract (runtime/contract.py): a worker whose sampling settings, group size,
        token limits, model or task differ from the run's would generate off-policy (or with another
        model or data): it is refused, with the first differing setting, never adapted."""
        c, msg = self.core, inbound.msg
        if msg.role != Role.WORKER or c.s.contract is None:
            return False
        why = contract.refusal(msg.sender, msg.contract, c.s.contract)
        if why is None:
            return False
        c.notice(f"refused {msg.sender}: {why}")
        c.refuse(inbound, why)
        return True
