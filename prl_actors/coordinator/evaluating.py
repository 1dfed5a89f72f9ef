"""Evaluation bookkeeping, a part of the coordinator (the design is in evaluation.py): one evaluation
at a time, of weights v_eval_epoch; its prompts are queued, held by one worker, or done, like an
epoch's groups (`CoordinatorCore.eval_work`); the run's last step waits for the final evaluation.
The state it reads and writes is the coordinator's (`eval_epoch`, `eval_work`, `eval_results`...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.coordinator.epoch_work import Accept, EpochWork
from prl_actors.coordinator.evaluation import summarize
from prl_actors.protocol.messages import Ack, EpochStart, EvalAssign, EvalResult, Role, WorkRequest
from prl_actors.protocol.versions import version_for

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore
    from prl_actors.runtime.membership import Member
    from prl_actors.transport.port import Inbound


class Evaluations:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def start(self, epoch: int, final: bool) -> bool:
        """Queue the evaluation of v_epoch when it is due; True when one was started."""
        c, plan = self.core, self.core.eval_plan
        if plan is None or not plan.due(epoch, c.s.epochs):
            return False
        if c.eval_epoch == epoch:  # already under way (an epoch_open retried)
            return True
        c.eval_epoch, c.final_eval = epoch, final
        c.eval_work = EpochWork([p.group_id for p in plan.prompts()])
        c.eval_results, c.eval_started = {}, c.now
        c.log("eval_start", eval_epoch=epoch, eval_version=version_for(epoch), prompts=c.eval_work.total)
        return True

    def blocks(self) -> bool:
        """An evaluation is under way (the workers must keep its weights until it is done)."""
        return self.core.eval_epoch >= 0 and not self.core.eval_work.complete

    def finish_run(self, epoch: int) -> None:
        """The last step is done: evaluate the final weights first when due, then end the run."""
        c = self.core
        c.final_epoch = epoch
        if self.blocks():  # the last epoch's own evaluation: the final one waits for it
            return
        if not c.final_eval and self.start(epoch, final=True):
            for m in c.members.of_role(Role.WORKER):
                c.to_member(m.name, self.start_msg())  # fetch the final weights
            return
        c.shutdown("completed")

    def start_msg(self) -> EpochStart:
        return EpochStart(epoch=self.core.eval_epoch, version=version_for(self.core.eval_epoch), groups=0)

    def assign(self, inbound: Inbound[WorkRequest], member: Member) -> bool:
        """Hand eval prompts to an idle worker holding the evaluated weights, when any are queued."""
        c = self.core
        msg, plan = inbound.msg, c.eval_plan
        if plan is None or not msg.eval_ok or not self.blocks() or not c.eval_work.queue:
            return False
        if msg.version != version_for(c.eval_epoch):
            return False
        workers = len(c.members.of_role(Role.WORKER))
        share = c.eval_work.fair_share(member.name, workers)
        if share == 0:
            return False
        ids = c.eval_work.assign(member.name, min(max(1, msg.max_groups), c.s.max_groups_per_request, share))
        by_id = {p.group_id: p for p in plan.prompts()}
        reply = EvalAssign(
            reply_to=msg.id,
            epoch=c.eval_epoch,
            version=version_for(c.eval_epoch),
            prompts=[by_id[i] for i in ids],
            samples=plan.samples,
        )
        c.reply(inbound, reply)
        c.log("eval_assign", worker=member.name, prompts=ids, msg_id=reply.id, request_id=msg.id)
        return True

    def result(self, now: float, inbound: Inbound[EvalResult]) -> None:
        c, msg = self.core, inbound.msg
        c.reply(inbound, Ack(reply_to=msg.id))
        if msg.epoch != c.eval_epoch or msg.version != version_for(c.eval_epoch) or not self.blocks():
            c.log("eval_result_ignored", worker=msg.sender, msg_epoch=msg.epoch, msg_version=msg.version)
            return
        mine = set(c.eval_work.held_by(msg.sender))
        for g in msg.groups:
            if g.prompt_id in mine and c.eval_work.accept(g.prompt_id)[0] is Accept.NEW:
                c.eval_results[g.prompt_id] = g
        self.release(msg.sender, "not returned")
        if c.eval_work.complete:
            self.done(now)

    def release(self, worker: str, reason: str) -> None:
        c = self.core
        lost = c.eval_work.release(worker)
        if lost:
            c.log("eval_requeue", worker=worker, prompts=lost, reason=reason)
            for name in c.work.take_waiting():
                c.to_member(name, self.start_msg() if c.final_eval else c.opening.epoch_start())

    def done(self, now: float) -> None:
        c, plan = self.core, self.core.eval_plan
        assert plan is not None
        epoch, version = c.eval_epoch, version_for(c.eval_epoch)
        groups = [c.eval_results[g] for g in sorted(c.eval_results)]
        summary: dict[str, float] = {"epoch": epoch, "version": version, **summarize(groups, plan.samples)}
        summary["eval_s"] = round(now - c.eval_started, 6)
        plan.done.add(epoch)
        c.eval_last = summary
        c.log("eval_done", eval_epoch=epoch, eval_version=version, summary=summary)
        if c.eval_sink is not None:
            c.eval_sink.eval_result(epoch, version, groups, summary)
        c.eval_epoch = -1
        if c.final_epoch >= 0:  # the last step was done while this evaluation ran (or it was the final one)
            self.finish_run(c.final_epoch)
        else:
            c.opening.maybe_open()  # the next epoch may have waited for this evaluation
