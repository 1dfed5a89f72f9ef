"""Assignment, a part of the coordinator: which groups a worker's WorkRequest gets, or why none.

A worker gets epoch-e groups only while the epoch runs and it holds weights within the epoch's bound
(`within_bound`), up to its fair share (epoch_work.py); each group carries a ticket (tickets.py)
without which the buffer refuses it. With no training work for it, an idle worker may get eval
prompts (evaluating.py); one told `queue_empty` is nudged with EpochStart when work returns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from prl_actors.protocol import tickets
from prl_actors.protocol.messages import NoWork, NoWorkReason, Phase, Prompt, Role, WorkAssign, WorkRequest
from prl_actors.protocol.versions import within_bound

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore
    from prl_actors.transport.port import Inbound


class Assigner:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def request(self, now: float, inbound: Inbound[WorkRequest]) -> None:
        c, msg = self.core, inbound.msg
        member = c.members.get(msg.sender)
        if member is None or member.role != Role.WORKER:
            c.refuse(inbound, "register as a worker first")
            return
        member.version = msg.version
        reason = self.no_work_reason(msg.version)
        if reason is not None:
            if reason != NoWorkReason.DONE and c.evals.assign(inbound, member):
                return
            self.no_work(inbound, member.name, reason)
            return
        share = c.work.fair_share(member.name, len(c.members.of_role(Role.WORKER)))
        if share == 0:
            self.no_work(inbound, member.name, NoWorkReason.FAIR_SHARE)
            return
        groups = c.work.assign(member.name, min(msg.max_groups, c.s.max_groups_per_request, share))
        c.assigned_at.update((g, now) for g in groups)
        prompts = [self.ticketed(c.prompts[g], member.name) for g in groups]
        reply = WorkAssign(reply_to=msg.id, epoch=c.epoch, version=msg.version, prompts=prompts)
        c.reply(inbound, reply)
        c.log("assign", worker=member.name, groups=groups, msg_id=reply.id, request_id=msg.id)

    def ticketed(self, prompt: Prompt, worker: str) -> Prompt:
        ticket = tickets.mint(self.core.ticket_key, self.core.epoch, prompt.group_id, worker)
        return msgspec.structs.replace(prompt, ticket=ticket)

    def no_work(self, inbound: Inbound[WorkRequest], worker: str, reason: NoWorkReason) -> None:
        c = self.core
        version = c.opening.floor(c.epoch)
        c.reply(inbound, NoWork(reply_to=inbound.msg.id, reason=reason, epoch=c.epoch, version=version))
        c.log("no_work", worker=worker, reason=reason, request_id=inbound.msg.id)
        if reason == NoWorkReason.QUEUE_EMPTY:
            c.work.waiting.add(worker)

    def no_work_reason(self, held_version: int) -> NoWorkReason | None:
        c = self.core
        if c.phase.is_(Phase.DONE):
            return NoWorkReason.DONE
        if not c.phase.is_(Phase.RUNNING):
            return NoWorkReason.NO_EPOCH
        if not within_bound(c.epoch, held_version, c.opening.bound(c.epoch)):
            return NoWorkReason.STALE_VERSION
        return None if c.work.queue else NoWorkReason.QUEUE_EMPTY

    def nudge(self) -> None:
        """Work is queued again: EpochStart to the workers told queue_empty."""
        c = self.core
        if c.work.queue:
            for name in c.work.take_waiting():
                c.to_member(name, c.opening.epoch_start())
